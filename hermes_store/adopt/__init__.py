"""Adopt a ``state.db`` written by Hermes Agent (schema_version 1–30) into hermes_store.

Hermes versions its file with a one-row ``schema_version`` table and hand-written
migrations; hermes_store uses Alembic revisions ``0001``…``0030`` that reproduce those
schemas exactly (revision ``00NN`` is Hermes schema version NN), plus revisions of its
own (``hs0001``…) that add only objects of its own. Adoption bridges the two: detect
which Hermes schema (and which real *shape*: Hermes adds columns without a version
bump, migrated files differ from created ones, FTS layouts change under one number,
SQLite may lack FTS5 or the trigram tokenizer) the file has, repair it into the shape
revision ``00NN`` reproduces, apply our own revisions that lie before ``00NN`` in the
chain, record ``00NN`` in our version table, and upgrade.

All-or-nothing, one adopter at a time, and safe against a kill at any instruction:

* :mod:`.shape` — what the file is (read-only);
* :mod:`.work` — every change happens on a private copy next to the original,
  verified before anything else moves;
* :mod:`.swap` — the lock, the journaled swap that puts the copy in place, and the
  recovery every open runs first.

The original is kept as ``state.db.pre-adopt.bak``, a 0600 copy with its WAL folded
in (one file, every committed row); the adopted ``state.db`` keeps the original's mode.
On any failure the original keeps every row (byte-for-byte unless the failure came
after its WAL was folded in) and the copy is removed.

A symlinked ``state.db`` is followed: the real file is adopted in its own folder and the
link keeps pointing at the result. A dangling link is refused.

Public API: :func:`check_file`, :func:`detect`, :func:`adopt`, :func:`needs_adoption`,
:func:`reference_schema`, :func:`finish_interrupted`.
"""

from __future__ import annotations

import os
import shutil
from contextlib import suppress
from pathlib import Path
from collections.abc import Callable

from alembic import command
from alembic.runtime.migration import MigrationContext

from .. import errors
from ..paths import (
    VERSION_TABLE,
    as_path,
    check_file,
    check_target,
    head,
    migration_connection,
    resolve_link,
    revision_order,
    run_alembic,
)
from . import swap, work
from .shape import HERMES_TABLES, AdoptionReport, Detected, Repair, detect, needs_adoption, reference_schema
from .swap import BACKUP_SUFFIX, finish_interrupted

__all__ = [
    "BACKUP_SUFFIX",
    "HERMES_TABLES",
    "AdoptionReport",
    "Detected",
    "Repair",
    "adopt",
    "check_file",
    "detect",
    "finish_interrupted",
    "needs_adoption",
    "reference_schema",
]

Progress = Callable[[str, float], None]

#: Copies taken before giving up on an original that is written to meanwhile.
COPY_ATTEMPTS = 3


def _nothing_to_do(p: os.PathLike[str], det: Detected, recovered: str | None) -> AdoptionReport:
    return AdoptionReport(
        path=p,  # type: ignore[arg-type]
        adopted=False,
        message=f"{p} is already a hermes_store database (revision {det.revision}); nothing to adopt",
        revision=det.revision,
        notes=[recovered] if recovered else [],
    )


def _new_database(p: os.PathLike[str], revision: str, version_table: str) -> AdoptionReport:
    """A 0-byte file is what SQLite calls a new, empty database: there is nothing of
    Hermes' to keep, so it simply gets our schema (as ``upgrade`` would give it)."""
    with migration_connection(p) as conn:
        run_alembic(conn, command.upgrade, revision, version_table=version_table)
        rev = MigrationContext.configure(conn, opts={"version_table": version_table}).get_current_revision()
        conn.rollback()
    return AdoptionReport(
        path=p,  # type: ignore[arg-type]
        adopted=False,
        message=f"{p} was an empty file: created a new hermes_store database at revision {rev}",
        revision=rev,
    )


def _refuse_problems(p: os.PathLike[str], det: Detected, revision: str) -> str:
    """The target revision, or a clear AdoptionError when the file cannot get there."""
    if det.problems:
        raise errors.AdoptionError(
            f"{p} (Hermes schema_version {det.schema_version}) has a shape adoption cannot repair; "
            "left unchanged:\n  - " + "\n  - ".join(det.problems)
        )
    target = head() if revision == "head" else revision
    order = revision_order()
    # Revision ids are not all numbers (ours are hs0001...): compare places in the chain.
    if target not in order or det.revision not in order or order.index(target) < order.index(det.revision):
        raise errors.AdoptionError(
            f"{p} is at Hermes schema_version {det.schema_version}; it can only be adopted to revision "
            f"{det.revision} or later, not {target!r}. Left unchanged"
        )
    return target


def adopt(
    path: str | os.PathLike[str],
    *,
    backup: bool = True,
    revision: str = "head",
    version_table: str | None = None,
    progress: Progress | None = None,
) -> AdoptionReport:
    """Turn a Hermes-made ``state.db`` into a hermes_store database, keeping every row.

    Steps, all on a copy in the same folder (made with SQLite's backup API, which also
    folds in uncheckpointed WAL content): apply the repairs :func:`detect` found
    (objects of a later version taken out, their data set aside; missing columns,
    tables, indexes, triggers and foreign keys added; the FTS objects re-created and
    re-indexed), apply our own revisions that lie before the file's Hermes revision,
    stamp that revision, upgrade to ``revision`` and put the set-aside data back, then
    verify — row counts per table equal the original's, FTS5 integrity-check passes,
    ``PRAGMA quick_check`` is ok, and the schema equals a fresh upgrade modulo unknown
    extras the original carried. Only then is the copy swapped in (see :mod:`.swap`).

    Refusals come before anything is written: typed errors for a dangling symlink, a
    folder, files that are not Hermes databases, and
    :class:`~hermes_store.errors.ReadOnlyDatabaseError` for a read-only file or folder
    (even one adopted already: adopting is a write). An exclusive lock spans the fingerprint, copy, verify and
    swap; a second adopter waits for it, then finds the file adopted and does nothing.
    A file hermes_store already owns is a no-op (``report.adopted`` is False).

    With ``backup=True`` the original stays next to it as ``state.db.pre-adopt.bak``
    (``.pre-adopt.1.bak``… if that name is taken): a copy with its WAL folded in.
    Stop Hermes while adopting: a write to the original after the copy was taken is
    noticed under SQLite's write lock and the copy taken again (up to
    :data:`COPY_ATTEMPTS` times); a process holding the file open at the swap is
    refused, since it would keep writing to the replaced file.

    Any failure raises :class:`~hermes_store.errors.AdoptionError` (chained from the
    cause) or one of the typed refusals, with every row of the original in place and
    no copy left behind.
    """
    vt = version_table or VERSION_TABLE
    report_progress = progress or (lambda _stage, _fraction: None)
    # Work next to the real file: a symlinked state.db keeps pointing at the result.
    p = resolve_link(as_path(path))
    # Path kind and permissions before anything else: the swap renames files in the
    # folder, so a read-only file or folder is refused here, untouched.
    check_target(p, write=True)
    recovered = finish_interrupted(p)
    if p.stat().st_size == 0:
        return _new_database(p, revision, vt)
    det = detect(p, version_table=vt, deep=False)
    if det.already_adopted:
        return _nothing_to_do(p, det, recovered)
    _refuse_problems(p, det, revision)

    with swap.adoption_lock(p):
        swap.step("locked")
        recovered = swap.recover_locked(p) or recovered
        # Another adopter may have finished while we waited; the deep check reads it all.
        det = detect(p, version_table=vt)
        if det.already_adopted:
            return _nothing_to_do(p, det, recovered)
        target = _refuse_problems(p, det, revision)
        _check_free_space(p)
        for attempt in range(COPY_ATTEMPTS):
            if attempt:
                # Written to since the copy was taken (Hermes running?): copy again.
                det = detect(p, version_table=vt, deep=False)
                target = _refuse_problems(p, det, revision)
            adopted = _copy_and_swap(p, det, target, vt, backup, report_progress)
            if adopted is not None:
                break
        else:
            raise errors.AdoptionError(
                f"{p} was written to by another process during each of {COPY_ATTEMPTS} adoption attempts "
                "(is Hermes running?); stop it and adopt again. Left unchanged"
            )
    report_progress("swap", 1.0)
    if recovered:
        adopted.notes.insert(0, recovered)
    return adopted


def _copy_and_swap(
    p: Path, det: Detected, target: str, vt: str, backup: bool, report_progress: Progress
) -> AdoptionReport | None:
    """Build and verify a copy, seal the original and swap; None when the original
    changed after the copy was taken (nothing moved, the copy removed)."""
    before = swap.fingerprint(p)
    copy = swap.new_work_file(p)
    try:
        report = work.build_copy(p, copy, det, target, vt, report_progress)
        swap.step("verified")
        report_progress("swap", 0.0)
        swap.restore_mode(copy, p)
        swap.step("fsync_work")
        sealed = swap.seal(p, before)
        if sealed is None:
            swap.remove_db_files(copy)
            return None
        report.backup_path = swap.swap_in(p, copy, sealed, backup=backup)
        return report
    except errors.HermesStoreError as exc:
        swap.remove_db_files(copy)
        if isinstance(exc, errors.AdoptionError):
            raise
        raise errors.AdoptionError(f"adopting {p} failed, left unchanged: {exc}") from exc
    except BaseException as exc:
        swap.remove_db_files(copy)
        if not isinstance(exc, Exception):
            raise
        raise errors.AdoptionError(f"adopting {p} failed, left unchanged: {type(exc).__name__}: {exc}") from exc


def _check_free_space(p: os.PathLike[str]) -> None:
    """Refuse early rather than fill the disk halfway through the copy."""
    wal = f"{os.fspath(p)}-wal"
    size = os.stat(p).st_size + (os.stat(wal).st_size if os.path.exists(wal) else 0)
    with suppress(OSError):
        free = shutil.disk_usage(os.path.dirname(os.fspath(p)) or ".").free
        if free < size * 2:
            raise errors.AdoptionError(
                f"not enough free space in {os.path.dirname(os.fspath(p))} to adopt {p} ({size} bytes needs about "
                f"{size * 2} free, {free} available); left unchanged"
            )
