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
from sqlalchemy.engine import URL

from .. import adopt, encryption, errors, migrations, paths
from ..engine import create_engine
from ..keys import VERSION_TABLE
from .endpoints import Endpoint, readonly_engine, sidecars_as_found
from .plan import WORK_PREFIX, WORK_SPACE_FACTOR, CopyReport, Progress

#: The encrypted source, attached to its work copy for the export.
_SOURCE = "hermes_store_copy_source"


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
def _work_folder(real: Path, folder: Path) -> Iterator[Path]:
    """A private folder in ``folder`` for a work copy of ``real`` (room for it checked),
    removed afterwards (and, if a kill leaves it, by the next run)."""
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
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def _work_copy(real: Path, folder: Path, progress: Progress) -> Iterator[Path]:
    """A private snapshot of ``real`` (SQLite's backup API, WAL content included), removed afterwards."""
    with _work_folder(real, folder) as work:
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
    if src.key is not None:
        with _keyed_source(real, src.key, work_dir, progress, report) as engine:
            yield engine
        return
    try:
        found = adopt.detect(real, deep=False)  # typed refusals: not a database, not Hermes', too new
    except errors.NotADatabaseError as exc:
        raise encryption.refused_without_key(real, exc) from exc  # an encrypted file: name the key
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



@contextmanager
def _encrypted_work_copy(real: Path, key: encryption.StoreKey, folder: Path,
                         progress: Progress) -> Iterator[Path]:
    """:func:`_work_copy` of an encrypted file: the private copy is a new file keyed with
    the source's key from its first byte (SQLCipher's ``sqlcipher_export`` from the
    source, attached read-only), so no page of it is ever plaintext on disk."""
    with _work_folder(real, folder) as work:
        tmp = work / "state.db"
        progress("snapshot", 0, 1)
        with sidecars_as_found(real, key), closing(encryption.connect(str(tmp), key, isolation_level=None)) as dst:
            source_uri = real.absolute().as_uri() + "?mode=ro"
            dst.execute(f"ATTACH DATABASE ? AS {_SOURCE} KEY {key.sql_literal()}", (source_uri,))
            try:
                dst.execute("BEGIN")
                dst.execute(f"SELECT sqlcipher_export('main', '{_SOURCE}')").fetchall()
                version = int(dst.execute(f"PRAGMA {_SOURCE}.user_version").fetchone()[0])
                dst.execute(f"PRAGMA main.user_version = {version}")
                dst.execute("COMMIT")
            finally:
                dst.execute(f"DETACH DATABASE {_SOURCE}")
        progress("snapshot", 1, 1)
        yield tmp


@contextmanager
def _keyed_source(real: Path, key: encryption.StoreKey, work_dir: Path, progress: Progress,
                  report: CopyReport) -> Iterator[Engine]:
    """An encrypted source (a store of ours: Hermes' files are plain, and ``encrypt``
    refuses one not adopted), read through its key: at our newest revision as it is, at
    an older one in an encrypted work copy upgraded there."""
    with readonly_engine(real, key) as engine, paths.connect(engine) as conn:
        revision = migrations.current(conn)  # a wrong key: EncryptionKeyError, before anything is written
        conn.rollback()
    newest = paths.head()
    if revision is None:
        raise errors.NotMigratedError(f"{real} holds no hermes_store database; there is nothing to copy")
    if revision not in paths.our_revision_ids() | set(migrations.LEGACY_IDS):
        raise errors.SchemaTooNewError(
            f"{real} is at revision {revision!r}, which this hermes_store does not know; upgrade hermes_store"
        )
    report.source_revision = revision
    if revision == newest:
        with readonly_engine(real, key) as engine:
            yield engine
        return
    report.source_work_copy = True
    with _encrypted_work_copy(real, key, work_dir, progress) as tmp:
        migrations.upgrade(encryption.url_with_key(URL.create("sqlite", database=str(tmp)), key))
        with readonly_engine(tmp, key) as engine:
            yield engine
