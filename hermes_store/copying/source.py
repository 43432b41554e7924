"""Reading the source without ever writing it: a file at our newest revision opened
read-only, an unadopted (or older) file adopted in a private snapshot, a server read in
one read-only serializable transaction."""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from contextlib import closing, contextmanager, suppress
from pathlib import Path
from collections.abc import Iterator

from sqlalchemy import Engine

from .. import adopt, errors, migrations, paths
from ..engine import create_engine
from ..keys import VERSION_TABLE
from .endpoints import Endpoint, readonly_engine
from .plan import WORK_PREFIX, WORK_SPACE_FACTOR, CopyReport, Progress


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process: alive
    return True


def _remove_stale_work_dirs(folder: Path) -> None:
    """Work folders of copies that were killed (their process is gone) are ours to remove."""
    with suppress(OSError):
        for entry in os.scandir(folder):
            if not entry.name.startswith(WORK_PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            pid = entry.name[len(WORK_PREFIX):].split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
                shutil.rmtree(entry.path, ignore_errors=True)


@contextmanager
def _work_copy(real: Path, folder: Path, progress: Progress) -> Iterator[Path]:
    """A private snapshot of ``real`` (SQLite's backup API, WAL content included), removed afterwards."""
    folder = folder.expanduser()
    if not folder.is_dir():
        raise errors.DatabaseUnavailableError(f"the work folder {folder} does not exist")
    _remove_stale_work_dirs(folder)
    size = real.stat().st_size
    with suppress(OSError):
        size += os.stat(f"{real}-wal").st_size
    with suppress(OSError):
        free = shutil.disk_usage(folder).free
        if free < size * WORK_SPACE_FACTOR:
            raise errors.DiskFullError(
                f"reading {real} needs an adopted copy of it, about {size * WORK_SPACE_FACTOR:,} bytes free in "
                f"{folder}, which has {free:,}; free some space or pass another work folder. Nothing was written"
            )
    try:
        work = Path(tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}-", dir=folder))
    except PermissionError as exc:
        raise errors.ReadOnlyDatabaseError(f"cannot create a work folder in {folder}: {exc}") from exc
    except OSError as exc:
        raise errors.DatabaseUnavailableError(f"cannot create a work folder in {folder}: {exc}") from exc
    try:
        tmp = work / "state.db"
        paths.create_private_database(tmp)
        with paths.readonly_connection(real) as src, closing(sqlite3.connect(tmp)) as dst:

            def step(_status: int, remaining: int, total: int) -> None:
                progress("snapshot", total - remaining, total)

            try:
                src.backup(dst, pages=4096, progress=step)
            except sqlite3.DatabaseError as exc:
                raise paths.sqlite_refusal(real, exc) from exc
        yield tmp
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def source_engine(src: Endpoint, work_dir: Path, progress: Progress, report: CopyReport) -> Iterator[Engine]:
    """An engine that reads the source at our newest revision, never writing it."""
    if src.url is not None:
        engine = create_engine(src.url, isolation_level="SERIALIZABLE")
        try:
            revision = migrations.current(engine)
            if revision is None:
                raise errors.NotMigratedError(f"{src.label} holds no hermes_store database; there is nothing to copy")
            if revision not in paths.our_revision_ids():
                raise errors.SchemaTooNewError(
                    f"{src.label} is at revision {revision!r}, which this hermes_store does not know; "
                    "upgrade hermes_store"
                )
            report.source_revision = revision
            yield engine
        finally:
            engine.dispose()
        return
    assert src.path is not None
    real = paths.check_target(src.path, write=False)
    found = adopt.detect(real, deep=False)  # typed refusals: not a database, not Hermes', too new
    newest = paths.head()
    if found.already_adopted and found.revision == newest:
        report.source_revision = newest
        with readonly_engine(real) as engine:
            yield engine
        return
    if found.already_adopted and found.revision is None:
        raise errors.NotAHermesDatabaseError(f"{real} has an empty {VERSION_TABLE} table; left unchanged")
    if found.already_adopted and found.revision not in paths.our_revision_ids() | set(migrations.LEGACY_IDS):
        raise errors.SchemaTooNewError(
            f"{real} is at revision {found.revision!r}, which this hermes_store does not know; upgrade hermes_store"
        )
    if found.problems:
        raise errors.AdoptionError(
            f"{real} (Hermes schema_version {found.schema_version}) has a shape adoption cannot repair, so it "
            "cannot be read; left unchanged:\n  - " + "\n  - ".join(found.problems)
        )
    report.source_revision = found.revision
    report.source_work_copy = True
    with _work_copy(real, work_dir, progress) as tmp:
        if found.already_adopted:
            migrations.upgrade(tmp)
        else:
            adopt.adopt(tmp, backup=False,
                        progress=lambda stage, fraction: progress(f"adopt:{stage}", round(fraction * 100), 100))
        with readonly_engine(tmp) as engine:
            yield engine

