"""The database file and what lies around it, below both migrations and adoption.

``migrations`` adopts Hermes files (it imports :mod:`hermes_store.adopt`), and adoption
runs our Alembic revisions on its private copy. What both need lives here, so the
dependency runs one way only (``migrations`` → ``adopt`` → ``paths``):

* where our revisions are and which one is newest (:func:`make_config`, :func:`head`)
  and how to run an Alembic command on one database (:func:`run_alembic`), on a
  connection whose failure to open is a typed error (:func:`connect`);
* what kind of path a caller handed us, checked before anything is written
  (:func:`check_target`: symlinks, folders, read-only files and folders);
* whether an existing file can be a SQLite database at all (:func:`check_file`);
* creating a new database file readable by its owner only
  (:func:`create_private_database`), and fsync helpers.

"Read-only" means what the owner asked for, not only what the kernel enforces: a
0400 file or a 0500 folder is refused even for root, who could write it anyway.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
import threading
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from functools import lru_cache
from typing import Any
from collections.abc import Callable, Iterable, Iterator

from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, inspect
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.util.concurrency import await_only

from . import errors, held_files

try:  # greenlet comes with the async extra; without it there is no event loop to share
    from greenlet import getcurrent as _current_flow
    from sqlalchemy.util.concurrency import in_greenlet
except ImportError:
    _current_flow = threading.get_ident

    def in_greenlet() -> bool:
        return False
from .dialects import find_for, for_connection
from .engine import check_schema, create_engine, to_url
from .keys import VERSION_TABLE


SQLITE_HEADER = b"SQLite format 3\x00"

#: Sidecar files SQLite keeps next to a database.
SIDECARS = ("-wal", "-shm", "-journal")


# ------------------------------------------------------------------ revisions


def script_location() -> Path:
    """Folder holding env.py and versions/ (installed copy first, source tree second)."""
    pkg_dir = Path(__file__).resolve().parent
    for candidate in (pkg_dir / "_alembic", pkg_dir.parent / "alembic"):
        if (candidate / "env.py").is_file():
            return candidate
    raise errors.HermesStoreError("hermes_store migrations are missing from this installation")


#: ``Config.attributes`` keys env.py reads: the tenant schema to migrate, and whether
#: the command may create it (upgrade, stamp) or only work in it (downgrade, current).
SCHEMA_ATTRIBUTE = "hermes_store.schema"
CREATE_SCHEMA_ATTRIBUTE = "hermes_store.create_schema"


def make_config(
    url: str | None = None, *, version_table: str = VERSION_TABLE, schema: str | None = None
) -> Config:
    """An Alembic Config pointing at our scripts, independent of any alembic.ini.

    ``schema``: the PostgreSQL schema of one tenant (see :func:`hermes_store.engine.check_schema`).
    """
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location()))
    cfg.set_main_option("version_table", version_table)
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if schema is not None:
        cfg.attributes[SCHEMA_ATTRIBUTE] = check_schema(schema)
    return cfg


def head() -> str:
    """The newest revision id shipped with this copy of hermes_store."""
    current = ScriptDirectory.from_config(make_config()).get_current_head()
    if current is None:  # Alembic's None: a script directory without revisions
        raise RuntimeError("hermes_store ships no Alembic revisions (broken install)")
    return current


@lru_cache(maxsize=1)
def revision_order() -> tuple[str, ...]:
    """Every revision id of our (linear) chain, oldest first; the scripts do not change while we run."""
    return tuple(reversed([s.revision for s in ScriptDirectory.from_config(make_config()).walk_revisions()]))


def our_revision_ids() -> frozenset[str]:
    return frozenset(revision_order())


def _pick_host_revision(
    tables: Iterable[str], columns: Callable[[str], list[str]], versions: Callable[[str], list[str]], skip: str
) -> tuple[str, str] | None:
    ids = our_revision_ids()
    for table in sorted(tables):
        if table == skip or columns(table) != ["version_num"]:
            continue  # not an Alembic version table (or ours)
        for rev in versions(table):
            if rev in ids:
                return table, rev
    return None


def host_revision(
    conn: Connection, version_table: str = VERSION_TABLE, *, schema: str | None = None
) -> tuple[str, str] | None:
    """``(table, revision)`` when a host application's Alembic ran our revisions as a
    branch of its own (README, "Way 2"), so our revision sits in *its* version table
    and ours does not exist. None otherwise (callers check our own table first).

    ``schema``: look in that PostgreSQL schema only (a tenant), not along the search path.
    """
    insp = inspect(conn)
    prefix = f'"{schema}".' if schema is not None else ""
    return _pick_host_revision(
        insp.get_table_names(schema=schema),
        lambda t: [c["name"] for c in insp.get_columns(t, schema=schema)],
        lambda t: [r[0] for r in conn.exec_driver_sql(f'SELECT version_num FROM {prefix}"{t}"')],
        version_table,
    )


def host_revision_raw(conn: sqlite3.Connection, version_table: str = VERSION_TABLE) -> tuple[str, str] | None:
    """:func:`host_revision` on a DB-API sqlite3 connection (adoption's read-only checks)."""
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    return _pick_host_revision(
        tables,
        lambda t: [r[1] for r in conn.execute(f'PRAGMA table_info("{t}")')],
        lambda t: [r[0] for r in conn.execute(f'SELECT version_num FROM "{t}"')],
        version_table,
    )


def run_alembic(
    conn: Connection,
    fn: Callable[..., Any],
    *args: Any,
    version_table: str = VERSION_TABLE,
    schema: str | None = None,
    create_schema: bool = False,
) -> Any:
    """Run an Alembic command (``command.upgrade``…) on ``conn``.

    A transaction the caller had open stays the caller's to commit or roll back, and
    the revisions run inside it; one the command left open on an idle connection is
    committed. Safe to call from inside another Alembic run (a host's env.py).

    ``schema`` runs the command in one tenant's PostgreSQL schema (env.py points the
    connection there and puts it back afterwards); ``create_schema`` lets it create
    the schema first.
    """
    hosted = conn.in_transaction()
    if hosted:
        join_driver_transaction(conn)
    cfg = make_config(version_table=version_table, schema=schema)
    cfg.attributes[CREATE_SCHEMA_ATTRIBUTE] = create_schema
    cfg.attributes["connection"] = conn
    with alembic_turn(), _outer_alembic_kept():
        result = fn(cfg, *args)
    if not hosted and conn.in_transaction():
        conn.commit()
    return result


def join_driver_transaction(conn: Connection) -> None:
    """Make the caller's open transaction a real one at the driver, so our DDL joins it.

    pysqlite (in its default mode) sends BEGIN only before INSERT/UPDATE/DELETE; a
    host that began a transaction and ran only DDL or SELECTs so far is still in
    autocommit underneath, and our CREATE TABLEs would commit on their own: the
    host's rollback could not take them back.
    """
    for_connection(conn).join_driver_transaction(conn)


class _AlembicTurn:
    """One Alembic command at a time in this process.

    Alembic's ``context`` and ``op`` are module globals that each command installs and
    removes: two threads (two stores opening at once) or two tasks of one event loop
    (async migrations run on the loop's greenlets) would install each other's and fail
    with ``KeyError: 'config'``. The owner is the greenlet, which is also what tells
    threads apart (each thread runs its own), so an inner run of the same command (a
    host's env.py calling us) passes. A thread waits on the lock; a task waits on its
    event loop, since blocking the loop would stall the very task that holds the turn.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: Any = None
        self._depth = 0

    @contextmanager
    def __call__(self) -> Iterator[None]:
        me = _current_flow()
        if self._owner is not None and self._owner == me:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        if in_greenlet():
            while not self._lock.acquire(blocking=False):
                await_only(asyncio.sleep(0.005))
        else:
            self._lock.acquire()
        self._owner, self._depth = me, 1
        try:
            yield
        finally:
            self._owner, self._depth = None, 0
            self._lock.release()


alembic_turn = _AlembicTurn()


@contextmanager
def _outer_alembic_kept() -> Iterator[None]:
    """Alembic's ``context``/``op`` are module-level proxies to the running command; an
    inner run (ours, called from a host's env.py) removes them on exit. Put the outer
    run's proxies back so the host's env.py carries on."""
    from alembic import context as context_module, op as op_module

    outer = [p for p in (getattr(context_module, "_proxy", None), getattr(op_module, "_proxy", None)) if p]
    try:
        yield
    finally:
        for proxy in outer:
            proxy._install_proxy()


@contextmanager
def migration_connection(target: Any, *, schema: str | None = None) -> Iterator[Connection]:
    """A connection for migrations: foreign keys off, since legacy files may hold
    dangling references and table rebuilds must not cascade. ``schema``: a tenant's
    PostgreSQL schema (or the one the URL names)."""
    engine = create_engine(target, foreign_keys=False, schema=schema)
    try:
        with connect(engine) as conn:
            yield conn
    finally:
        engine.dispose()


def connect(engine: Engine) -> Connection:
    """``engine.connect()``, with a server that cannot be reached (down, no such
    database, login refused) reported as a typed error instead of the driver's."""
    try:
        return engine.connect()
    except DBAPIError as exc:
        if for_connection(engine).holders_on_this_machine:
            raise  # a database of this machine's: the path checks before us and the error hooks type it
        reason = " ".join(str(exc.orig if exc.orig is not None else exc).split())
        where = engine.url.render_as_string(hide_password=True)
        raise errors.DatabaseUnavailableError(f"cannot connect to {where}: {reason}") from exc


# ------------------------------------------------------------------ path kinds


def _is_file_url(url: URL) -> bool:
    """Whether ``url`` names a database file (not a server, not an in-memory database)."""
    found = find_for(url)
    return found is not None and found.database_path(url) is not None


def as_path(target: str | os.PathLike[str]) -> Path:
    """A file path from a path or a ``sqlite:///`` URL (adoption works on files only)."""
    s = os.fspath(target)
    if "://" in s:
        url = to_url(s)
        if url.database is None or not _is_file_url(url):
            raise errors.AdoptionError(f"adoption needs a SQLite file, got {url.render_as_string()}")
        s = url.database
    return Path(s).expanduser()


def _owner_can_write(st: os.stat_result) -> bool:
    """The write bit that applies to us; root only counts bits someone has."""
    euid = os.geteuid()
    if euid == st.st_uid:
        return bool(st.st_mode & stat.S_IWUSR)
    if euid == 0:
        return bool(st.st_mode & 0o222)
    return True  # the kernel decides for others; os.access below asks it


def is_read_only(p: Path) -> bool:
    """True when ``p`` (file or folder) must not be written: no write bit, or the
    kernel says no (read-only mount, ACLs)."""
    try:
        st = p.stat()
    except OSError:
        return False
    return not _owner_can_write(st) or not os.access(p, os.W_OK)


def resolve_link(path: Path) -> Path:
    """Follow a symlinked database path to the real file.

    Adoption swaps the *target* (next to it, in its folder), so the link keeps pointing
    at the adopted file, and SQLite, which also resolves links, keeps its ``-wal``
    next to the target. A dangling or looping link is refused: opening it would create
    a file wherever it points.
    """
    if not path.is_symlink():
        return path
    try:
        return Path(os.path.realpath(path, strict=True))
    except OSError as exc:
        try:
            where = os.readlink(path)
        except OSError:
            where = "?"
        raise errors.DatabaseUnavailableError(
            f"{path} is a symbolic link to {where}, which does not exist (or loops); nothing was created"
        ) from exc


def _existing_ancestor(folder: Path) -> Path:
    """The nearest ancestor of ``folder`` that exists (as anything, links followed)."""
    cur = folder
    while not cur.exists():
        if cur.is_symlink():
            raise errors.DatabaseUnavailableError(f"cannot use {folder}: {cur} is a dangling symbolic link")
        parent = cur.parent
        if parent == cur:
            break
        cur = parent
    return cur


def check_target(
    path: str | os.PathLike[str], *, write: bool, create: bool = False, make_parents: bool = False
) -> Path:
    """Check a database path before anything touches it; return the real file path.

    Raises (having written nothing):

    * :class:`~hermes_store.errors.DatabaseUnavailableError` — a dangling or looping
      symlink, a missing file when ``create`` is False, a missing folder (unless
      ``make_parents``), a path below a regular file, an unreadable file;
    * :class:`~hermes_store.errors.NotADatabaseError` — a folder or a special file
      where the database should be;
    * :class:`~hermes_store.errors.ReadOnlyDatabaseError` — ``write`` is asked and the
      file or its folder is read-only (SQLite creates ``-wal``/``-journal`` files next
      to the database, so writing needs the folder too).
    """
    p = resolve_link(Path(path).expanduser())
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.exists():
        anc = _existing_ancestor(folder)
        if not anc.is_dir():
            raise errors.DatabaseUnavailableError(f"cannot use {p}: {anc} is a file, not a folder")
        if not make_parents:
            raise errors.DatabaseUnavailableError(f"cannot open {p}: folder {folder} does not exist")
        if is_read_only(anc):
            raise errors.ReadOnlyDatabaseError(f"cannot create {p}: folder {anc} is read-only")
        return p
    if not folder.is_dir():
        raise errors.DatabaseUnavailableError(f"cannot use {p}: {folder} is a file, not a folder")
    try:
        st = p.stat()
    except FileNotFoundError:
        if not create:
            raise errors.DatabaseUnavailableError(f"{p} does not exist") from None
        if is_read_only(folder):
            raise errors.ReadOnlyDatabaseError(f"cannot create {p}: folder {folder} is read-only") from None
        return p
    except OSError as exc:
        raise errors.DatabaseUnavailableError(f"cannot use {p}: {exc}") from exc
    _require_regular_file(p, st)
    if not os.access(p, os.R_OK):
        raise errors.DatabaseUnavailableError(f"cannot read {p}: permission denied; left unchanged")
    if write and is_read_only(p):
        raise errors.ReadOnlyDatabaseError(f"{p} is read-only (mode {stat.S_IMODE(st.st_mode):04o}); left unchanged")
    if write and is_read_only(folder):
        raise errors.ReadOnlyDatabaseError(
            f"{p} is in a read-only folder ({folder}), where SQLite cannot create its journal; left unchanged"
        )
    return p


def make_parents(p: Path) -> None:
    """Create the folders above a new database, with typed errors."""
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except PermissionError as exc:
        raise errors.ReadOnlyDatabaseError(f"cannot create folder {p.parent}: {exc}") from exc
    except OSError as exc:
        raise errors.DatabaseUnavailableError(f"cannot create folder {p.parent}: {exc}") from exc


# ------------------------------------------------------------------ new files


def create_private_database(path: Path) -> bool:
    """Create the database file readable by its owner only (0600); False if it exists.

    The file is created with that mode (no window where others could open it), then
    given a SQLite header so it is a real, empty database and not a 0-byte file,
    which :func:`check_file` refuses as a likely failed copy. When another process
    created it first, this waits briefly for that header instead of racing it.
    """
    folder = path.parent if str(path.parent) else Path(".")
    if not path.exists() and is_read_only(folder):
        # Root's open() would succeed in a 0555 folder, and the file would stay behind
        # when the journal (also refused there by check_target) stops the migration.
        raise errors.ReadOnlyDatabaseError(f"cannot create {path}: folder {folder} is read-only")
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        deadline = time.monotonic() + 2.0
        with suppress(OSError):
            while path.stat().st_size == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
        return False
    except PermissionError as exc:
        raise errors.ReadOnlyDatabaseError(f"cannot create {path}: {exc}") from exc
    except OSError as exc:
        raise errors.DatabaseUnavailableError(f"cannot create {path}: {exc}") from exc
    os.close(fd)
    try:
        conn = sqlite3.connect(path)
        try:
            conn.execute("PRAGMA user_version = 0")  # writes the 100-byte header page
        finally:
            conn.close()
    except BaseException as exc:
        for f in (path, *(Path(f"{path}{s}") for s in SIDECARS)):
            with suppress(OSError):
                f.unlink()
        if isinstance(exc, sqlite3.Error):
            raise errors.DatabaseUnavailableError(f"cannot create {path}: {exc}") from exc
        raise
    return True


def fsync_file(p: Path) -> None:
    """fsync a database file through the process's kept descriptor (never one we close:
    see :mod:`hermes_store.held_files`)."""
    held_files.fsync(p)


def fsync_dir(d: Path) -> None:
    """Make renames/creations in ``d`` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(d, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        with suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------ reading


@contextmanager
def readonly_connection(p: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection that leaves the file exactly as it found it.

    A reader of a WAL-mode file creates ``-wal``/``-shm`` sidecars when they are
    missing, and a read-only connection cannot remove them again. When we created
    them (and the WAL stayed empty) one short read-write open lets SQLite itself
    remove them; SQLite only does so when no other connection uses the file, and an
    empty WAL means nothing is written to the database file (its bytes and mtime stay
    as they were, even for a 0400 file that root may open). Where the kernel refuses
    that open, the two empty files we created are removed directly.
    """
    wal, shm = Path(f"{p}-wal"), Path(f"{p}-shm")
    had_wal, had_shm = wal.exists(), shm.exists()
    conn = sqlite3.connect(p.absolute().as_uri() + "?mode=ro", uri=True, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()
        if not had_wal and wal.exists() and not had_shm:
            with suppress(OSError, sqlite3.Error):
                if wal.stat().st_size == 0:
                    if os.access(p, os.W_OK):
                        rw = sqlite3.connect(p.absolute().as_uri() + "?mode=rw", uri=True, isolation_level=None)
                        try:
                            rw.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
                        finally:
                            rw.close()
                    else:
                        shm.unlink()
                        wal.unlink()


def sqlite_refusal(p: Path, exc: sqlite3.DatabaseError) -> errors.HermesStoreError:
    """Map a driver error met while only reading to the typed refusal it means."""
    msg = str(exc)
    if isinstance(exc, sqlite3.OperationalError) and ("locked" in msg or "busy" in msg):
        # Another process holds the file for a moment: worth waiting for.
        return errors.DatabaseLockedError(f"cannot read {p} now: {msg}; left unchanged")
    if isinstance(exc, sqlite3.OperationalError) and ("unable to open" in msg or "readonly" in msg):
        return errors.DatabaseUnavailableError(f"cannot read {p}: {msg}; left unchanged")
    if "malformed" in msg or "corrupt" in msg:
        return errors.NotADatabaseError(f"{p} is corrupt ({msg}); left unchanged")
    return errors.NotADatabaseError(f"{p} is not a usable SQLite database ({msg}); left unchanged")


def _require_regular_file(p: Path, st: os.stat_result) -> None:
    """A database is a regular file: a folder or a device/FIFO is refused, untouched."""
    if stat.S_ISDIR(st.st_mode):
        raise errors.NotADatabaseError(f"{p} is a folder, not a database file; left unchanged")
    if not stat.S_ISREG(st.st_mode):
        raise errors.NotADatabaseError(f"{p} is not a regular file; left unchanged")


def _refuse_unfinished_journal(p: Path, journal: Path) -> None:
    """A rollback journal is a live writer's (wait for it), a crashed one's (hot: refused),
    or a crashed one's that never got its header written (not hot: SQLite ignores it).

    SQLite tells them apart itself: a read-only connection refuses to read past a hot
    journal (SQLITE_READONLY_ROLLBACK), as only a read-write open may roll it back, and
    reads past the others. Then only a writer's RESERVED lock separates the live case,
    which :class:`~hermes_store.errors.DatabaseLockedError` reports so an opener waits it
    out; ``BEGIN IMMEDIATE`` asks for that lock and is rolled back at once, writing nothing.
    """
    try:
        with readonly_connection(p) as conn:
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorname", None) == "SQLITE_READONLY_ROLLBACK":
            raise errors.AdoptionError(
                f"{p} has an unfinished transaction ({journal.name}); open it once with Hermes or the "
                "sqlite3 shell to recover it, then adopt. Left unchanged"
            ) from exc
        raise sqlite_refusal(p, exc) from exc
    if not os.access(p, os.W_OK):
        return  # nobody can be writing it through this kernel's permissions; not hot either
    _read_write(p, "BEGIN IMMEDIATE", "ROLLBACK")  # a live writer: DatabaseLockedError


def recover_journal(p: Path) -> None:
    """Let SQLite roll back a crashed writer's journal next to ``p``, as any read-write
    open would (Hermes' own next open does exactly this), before a migration or an
    adoption reads the file. A live writer's journal is
    :class:`~hermes_store.errors.DatabaseLockedError` (wait for it); no journal, nothing."""
    journal = Path(f"{p}-journal")
    if journal.exists() and journal.stat().st_size > 0:
        _read_write(p, "SELECT 1 FROM sqlite_master LIMIT 1")


def _read_write(p: Path, *statements: str) -> None:
    """Run ``statements`` on a short read-write connection that never waits for a lock;
    driver errors come out typed (:func:`sqlite_refusal`: a held lock is
    :class:`~hermes_store.errors.DatabaseLockedError`)."""
    try:
        conn = sqlite3.connect(p.absolute().as_uri() + "?mode=rw", uri=True, isolation_level=None, timeout=0)
        try:
            for sql in statements:
                conn.execute(sql).fetchall()
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise sqlite_refusal(p, exc) from exc


def _header_problem(p: Path, header: bytes, size: int) -> errors.HermesStoreError | None:
    """What the 100-byte header says is wrong with a file SQLite refused, or None.

    Only read once SQLite itself has refused the file (see :func:`check_file`), through
    :mod:`hermes_store.held_files`, never by an ``open()`` and close of our own.
    """
    if not header.startswith(SQLITE_HEADER):
        return errors.NotADatabaseError(
            f"{p} is not a SQLite database (no SQLite header; a text file or an encrypted database?); left unchanged"
        )
    if len(header) < 100:
        return errors.NotADatabaseError(f"{p} is truncated ({size} bytes); left unchanged")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1):
        return errors.NotADatabaseError(f"{p} is corrupt (invalid page size {page_size}); left unchanged")
    pages = int.from_bytes(header[28:32], "big")
    # The in-header page count is trustworthy only when its "valid-for" counter matches.
    valid = header[24:28] == header[92:96]
    return _size_problem(p, page_size, pages if valid else 0, size)


def _size_problem(p: Path, page_size: int, pages: int, size: int) -> errors.HermesStoreError | None:
    """A file shorter than the pages it promises, or not a whole number of pages."""
    if pages and size < pages * page_size:
        return errors.NotADatabaseError(
            f"{p} is truncated: the header promises {pages} pages of {page_size} bytes "
            f"({pages * page_size} bytes) but the file has {size}; left unchanged"
        )
    if size % page_size:
        return errors.NotADatabaseError(
            f"{p} is truncated or corrupt: {size} bytes is not a whole number of "
            f"{page_size}-byte pages; left unchanged"
        )
    return None


def _refused_by_sqlite(p: Path, exc: sqlite3.DatabaseError) -> errors.HermesStoreError:
    """The typed refusal of a file SQLite would not read; for a file it calls "not a
    database" or "malformed", the header says which (text file, truncated, bad page size)."""
    if getattr(exc, "sqlite_errorname", None) in ("SQLITE_NOTADB", "SQLITE_CORRUPT"):
        with suppress(OSError):
            found = _header_problem(p, held_files.read_prefix(p, 100), p.stat().st_size)
            if found is not None:
                return found
    return sqlite_refusal(p, exc)


def check_file(path: str | os.PathLike[str], *, recovery_ok: bool = False) -> None:
    """Refuse, without touching it, a file that cannot be a usable SQLite database.

    Cheap checks only (a stat, and SQLite's own read of the header and the schema on a
    read-only connection): a text file, a truncated copy or a file whose schema cannot
    be read. A 0-byte file passes: like SQLite itself, we take it for a new, empty
    database (a fresh ``touch``, or what a connect on an unmigrated path left behind).
    The file is never opened behind SQLite's back (see :mod:`hermes_store.held_files`):
    closing our own descriptor would drop the locks of every connection of the process.

    A hot rollback journal next to the file means a writer crashed mid-transaction;
    only a read-write open can roll it back. ``recovery_ok`` (ordinary upgrades) leaves
    that to SQLite (:func:`recover_journal`, whose own read types what it meets);
    adoption, which must not write the original, refuses instead.
    """
    p = as_path(path)
    try:
        st = p.stat()
    except FileNotFoundError as exc:
        if p.is_symlink():
            raise errors.DatabaseUnavailableError(f"{p} is a dangling symbolic link; nothing was created") from exc
        raise errors.DatabaseUnavailableError(f"{p} does not exist") from exc
    except OSError as exc:
        raise errors.DatabaseUnavailableError(f"cannot read {p}: {exc}") from exc
    _require_regular_file(p, st)
    if st.st_size == 0:
        return
    journal = Path(f"{p}-journal")
    if journal.exists() and journal.stat().st_size > 0:
        if recovery_ok:
            return
        _refuse_unfinished_journal(p, journal)
    try:
        with readonly_connection(p) as conn:
            conn.execute("BEGIN")
            conn.execute("SELECT type, name, sql FROM sqlite_master").fetchall()  # takes the read lock
            page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
            pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
            # Read under the read lock: no rollback-mode writer can change the file now.
            size = p.stat().st_size
            # While a WAL exists its pages count too, and a checkpoint writes page 1 (with
            # the new page count) before the file grows: the sizes prove nothing then.
            in_wal = Path(f"{p}-wal").exists()
            conn.execute("COMMIT")
    except sqlite3.DatabaseError as exc:
        raise _refused_by_sqlite(p, exc) from exc
    except OSError as exc:
        raise errors.DatabaseUnavailableError(f"cannot read {p}: {exc}") from exc
    if not in_wal:
        found = _size_problem(p, page_size, pages, size)
        if found is not None:
            raise found
