"""Encrypt, decrypt or re-key a SQLite store file in place, all or nothing.

``hermes-store encrypt`` / ``decrypt`` / ``rekey`` run :func:`recrypt`: SQLCipher's
``sqlcipher_export`` writes the whole database into a new private file next to the
original (keyed with the new key, or plain), which is then checked against the
original (the schema, every table's row count and a checksum of its rows, FTS5
``integrity-check`` on every full-text index, ``quick_check``), fsynced, and put in
the original's place with adoption's swap (:mod:`.swap`): under the adoption lock,
the original sealed (nothing written since the export, its WAL folded in, SQLite's
exclusive lock held), then ONE rename. A kill at any step leaves the original
readable with its old key (before the rename) or the complete new file (after it);
the next open or run tidies up (:func:`.swap.finish_interrupted`).

No backup of the original is kept: for ``encrypt`` it would be a plaintext copy of
what was just encrypted. Steps announced to :data:`.swap.fault_hook`: ``locked``,
``exported``, ``verified``, ``fsync_work``, then the swap's (``fold_wal``, ``sealed``,
``fsync_marker``, ``marker``, ``rename_db``, ``fsync_dir``, ``cleanup``).
"""

from __future__ import annotations

import hashlib
import os
from contextlib import closing, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import encryption, errors
from ..dialects.sqlite import DIALECT
from ..paths import SIDECARS, fsync_file, resolve_link
from . import swap
from . import COPY_ATTEMPTS

__all__ = ["Recrypted", "recrypt"]

#: The attached database an export writes into.
_TARGET = "hermes_store_recrypt"


@dataclass
class Recrypted:
    """What :func:`recrypt` did: the file, whether it is now encrypted, what was checked."""

    path: Path
    encrypted: bool
    tables: dict[str, int] = field(default_factory=dict)
    fts_indexes: list[str] = field(default_factory=list)
    attempts: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "encrypted": self.encrypted, "tables": dict(self.tables),
                "fts_indexes": list(self.fts_indexes), "attempts": self.attempts}


def _open(p: Path, key: encryption.StoreKey | None, timeout: float = 5.0) -> Any:
    """A SQLCipher connection to ``p`` (autocommit): keyed, or plain for a plain file."""
    if key is not None:
        return encryption.connect(str(p), key, isolation_level=None, timeout=timeout)
    module = encryption.dbapi_module()
    conn = module.connect(str(p), isolation_level=None, timeout=timeout)
    try:
        encryption.verify(conn, None, str(p))
    except BaseException:
        conn.close()
        raise
    return conn


def _schema(conn: Any) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in conn.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\' "
        "ORDER BY type, name").fetchall()]


def _checksum(conn: Any, table: str) -> str:
    """A checksum of a table's rows, whatever order they come in."""
    rows = sorted(repr(tuple(r)) for r in conn.execute(f'SELECT * FROM "{table}"'))
    digest = hashlib.sha256()
    for row in rows:
        digest.update(row.encode("utf-8", "surrogatepass"))
        digest.update(b"\n")
    return digest.hexdigest()


def _facts(conn: Any) -> tuple[list[tuple[Any, ...]], dict[str, int], dict[str, str], list[str], int]:
    plain, virtual = DIALECT.table_counts(conn)
    counts = dict(plain)
    sums = {name: _checksum(conn, name) for name in counts}
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    return _schema(conn), counts, sums, virtual, version


def _export(src: Any, work: Path, new_key: encryption.StoreKey | None) -> Any:
    """The original's facts and its export into ``work``, from one snapshot of it."""
    literal = new_key.sql_literal() if new_key is not None else "''"
    src.execute(f"ATTACH DATABASE ? AS {_TARGET} KEY {literal}", (str(work),))
    try:
        src.execute("BEGIN")
        try:
            expected = _facts(src)
            src.execute(f"SELECT sqlcipher_export('{_TARGET}')").fetchall()
            src.execute(f"PRAGMA {_TARGET}.user_version = {int(expected[4])}")
            src.execute("COMMIT")
        except BaseException:
            with suppress(Exception):
                src.execute("ROLLBACK")
            raise
    finally:
        src.execute(f"DETACH DATABASE {_TARGET}")
    return expected


def _verify(p: Path, work: Path, new_key: encryption.StoreKey | None,
            expected: tuple[list[tuple[Any, ...]], dict[str, int], dict[str, str], list[str], int],
            wal: bool) -> None:
    """The new file holds what the original held (else AdoptionError; the original stays)."""
    schema, counts, sums, virtual, version = expected
    with closing(_open(work, new_key)) as conn:
        got = _facts(conn)
        problems = []
        if got[0] != schema:
            problems.append("the schema differs")
        if got[1] != counts:
            problems.append(f"row counts differ ({sorted(set(got[1].items()) ^ set(counts.items()))[:4]})")
        elif got[2] != sums:
            problems.append(f"row checksums differ ({sorted(t for t in sums if got[2].get(t) != sums[t])[:4]})")
        if got[4] != version:
            problems.append("user_version differs")
        for index in virtual:
            try:
                conn.execute(f'INSERT INTO "{index}"("{index}") VALUES (\'integrity-check\')')
            except Exception as exc:  # the driver's error: the index does not match its rows
                problems.append(f"full-text index {index}: {exc}")
        check = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
        if check != ["ok"]:
            problems.append(f"quick_check: {check[:3]}")
        if wal:
            conn.execute("PRAGMA journal_mode=WAL").fetchall()  # as the original was: kept in the header
    if problems:
        raise errors.AdoptionError(
            f"the new copy of {p} does not match it ({'; '.join(problems)}); it was removed and {p} left unchanged"
        )


def _remove(work: Path) -> None:
    for f in (work, *(Path(f"{work}{s}") for s in SIDECARS)):
        with suppress(FileNotFoundError):
            f.unlink()


def recrypt(path: str | os.PathLike[str], old_key: encryption.StoreKey | None,
            new_key: encryption.StoreKey | None) -> Recrypted:
    """Rewrite the store at ``path`` (opened with ``old_key``; None: a plain file) as one
    opened with ``new_key`` (None: plain), all or nothing (see the module docstring).

    A wrong or missing ``old_key``: EncryptionKeyError, the file unchanged. Another
    program holding the file open at the swap: AdoptionError, the file unchanged.
    """
    if old_key is None and new_key is None:
        raise errors.InvalidInputError("nothing to do: neither the old nor the new key is given")
    p = resolve_link(Path(path).expanduser())
    if not p.is_file():
        raise errors.DatabaseUnavailableError(f"no database file at {p}")
    with swap.adoption_lock(p):
        swap.recover_locked(p)
        swap.step("locked")
        for attempt in range(1, COPY_ATTEMPTS + 1):
            before = swap.fingerprint(p)
            work = swap.new_work_file(p)
            try:
                with closing(_open(p, old_key)) as src:
                    wal = str(src.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal"
                    expected = _export(src, work, new_key)
                swap.step("exported")
                _verify(p, work, new_key, expected, wal)
                swap.step("verified")
                for sidecar in SIDECARS:  # the copy's own, closed now: none should be left
                    with suppress(FileNotFoundError):
                        Path(f"{work}{sidecar}").unlink()
                fsync_file(work)
                swap.step("fsync_work")
                sealed = swap.seal(p, before, connect=lambda f, timeout: _open(f, old_key, timeout))
                if sealed is None:
                    _remove(work)
                    continue  # written to since the export: take it again
                swap.restore_mode(work, p)
                swap.swap_in(p, work, sealed, backup=False)
            except BaseException:
                _remove(work)
                raise
            return Recrypted(path=p, encrypted=new_key is not None, tables=expected[1], fts_indexes=expected[3],
                             attempts=attempt)
    raise errors.AdoptionError(f"{p} kept being written to while it was being rewritten; left unchanged, "
                               "try again when the programs using it are idle")
