"""Nothing of ours drops SQLite's locks (issue 29, point 1).

POSIX record locks belong to the process: closing ANY descriptor of a database file
drops every lock the process holds on it, SQLite's included. On 7b829f2 a second
``SessionDB`` on a file (its header check did ``open(path).read(100)`` and closed it)
took away the first one's locks; another process then checkpointed and deleted the WAL
under it, and acknowledged writes were lost.

Three kinds of proof here:

* the inventory: every ``open``-like call in the package is listed with why it is safe
  (never a database file, its ``-wal``, ``-shm`` or ``-journal``), and a new one fails
  the test until it is reviewed;
* the locks themselves: a connection in this process holds SQLite's locks on the file
  (read from ``/proc/locks``), every entry point that may touch the file runs, and the
  locks are all still there, in WAL and in rollback-journal mode;
* the consequence: while this process holds a read transaction, another process cannot
  take the file for unused (its checkpoint-and-delete of the WAL would be a lost write).
"""

from __future__ import annotations

import ast
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from collections.abc import Callable, Iterator

import pytest

from hermes_store import SessionDB, adopt, held_files, migrations, paths, state_files
from hermes_store.engine import create_engine
from hermes_store.uow import UnitOfWork
from hermes_store.repositories import SessionRepository

from .test_cli import run

PACKAGE = Path(__file__).resolve().parent.parent / "hermes_store"

# ---------------------------------------------------------------------- the inventory

#: Calls that open a file by name (or copy/read one whole).
_OPENERS = {"open", "fdopen", "read_bytes", "write_bytes", "read_text", "write_text", "copyfile", "copy",
            "copy2", "copyfileobj", "copytree", "mmap"}

#: (module, enclosing function, call) -> why it never opens a database file or a sidecar.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("held_files.py", "_descriptor", "os.open"):
        "THE registry: one read-only descriptor per database file, kept open while the file has a name",
    ("paths.py", "create_private_database", "os.open"):
        "O_CREAT|O_EXCL: a file that did not exist a moment ago; no connection can hold a lock on it",
    ("paths.py", "fsync_dir", "os.open"): "a folder, never a database file",
    ("dialects/sqlite.py", "create_private_file", "os.open"):
        "O_CREAT|O_EXCL before SQLite's first connect: a new file, no lock can exist on it",
    ("locks.py", "try_flock", "os.open"): "our own lock files (.adopt-lock, .copy-lock, .repair.lock)",
    ("encryption.py", "read_key_file", "read_text"): "the key file ($HERMES_STORE_KEY_FILE), never a database file",
    ("operations/retention.py", "__init__", "os.open"):
        "O_CREAT|O_EXCL of a new retention archive (JSON Lines); never a database file",
    ("state_files.py", "quarantine_zeroed_state_db", "os.open"): "the .quarantine.lock file",
    ("repair.py", "_backup_db_file", "os.open"):
        "O_CREAT of the new backup file; the database is read through held_files",
    ("repair.py", "_record_failure", "os.open"): "the repair ledger's temp file (JSON)",
    ("repair.py", "_record_failure", "os.fdopen"): "the repair ledger's temp file (JSON)",
    ("repair.py", "_recorded_failures", "read_text"): "the repair ledger (JSON)",
    ("adopt/swap.py", "_private_copy", "os.open"):
        "O_EXCL of the new backup file; the sealed original is read through held_files",
    ("adopt/swap.py", "_write_marker", "os.open"): "the swap marker's temp file (JSON)",
    ("adopt/swap.py", "_write_marker", "open"): "wraps the marker's own descriptor",
    ("adopt/swap.py", "_read_marker", "read_text"): "the swap marker (JSON)",
    ("adopt/shape.py", "reference_schema", "read_text"): "a reference schema JSON shipped in the package",
    ("state_modules/schema.py", "_parse_schema_columns", "read_text"): "a JSON cache file of parsed DDL",
    ("state_modules/schema.py", "_parse_schema_columns", "write_text"): "a JSON cache file of parsed DDL",
    ("hermes_config.py", "load_config", "read_text"): "Hermes' config.yaml",
    ("cli/_base.py", "_silence_stdout", "os.open"): "os.devnull",
    ("cli/_common.py", "atomic_output", "os.fdopen"): "the output's own new temp file (refused when it is the store)",
    ("cli/transfer.py", "import_cmd", "open"): "the JSONL input (refused when it is the store or one of its files)",
}


def _calls() -> Iterator[tuple[str, str, str, int]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        yield from _visit(ast.parse(path.read_text(encoding="utf-8")), module, [])


def _visit(node: ast.AST, module: str, stack: list[str]) -> Iterator[tuple[str, str, str, int]]:
    """The opener calls under ``node``, each with the function it sits in (``stack``)."""
    named = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    if named:
        stack.append(node.name)  # type: ignore[union-attr]
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id in _OPENERS:
            yield module, stack[-1] if stack else "<module>", func.id, node.lineno
        elif isinstance(func, ast.Attribute) and func.attr in _OPENERS:
            owner = func.value.id if isinstance(func.value, ast.Name) else ""
            if owner != "self":  # self.open(): AsyncSessionDB's own method, not a file
                name = f"{owner}.{func.attr}" if owner in ("os", "io", "shutil", "mmap") else func.attr
                yield module, stack[-1] if stack else "<module>", name, node.lineno
    for child in ast.iter_child_nodes(node):
        yield from _visit(child, module, stack)
    if named:
        stack.pop()


def test_every_file_open_in_the_package_is_accounted_for() -> None:
    found = {(m, f, c): line for m, f, c, line in _calls()}
    unknown = sorted(f"{m}:{line} {f}() calls {c}" for (m, f, c), line in found.items() if (m, f, c) not in ALLOWED)
    assert not unknown, (
        "new file opens; prove each never opens a database file or its -wal/-shm/-journal "
        "(closing it would drop SQLite's locks: read through hermes_store.held_files or ask SQLite), "
        "then list it in ALLOWED:\n" + "\n".join(unknown)
    )
    stale = sorted(f"{m} {f}() {c}" for (m, f, c) in ALLOWED if (m, f, c) not in found)
    assert not stale, "ALLOWED lists opens that are gone:\n" + "\n".join(stale)


# ---------------------------------------------------------------------- the locks

def _locks_of_this_process(*files: Path) -> list[tuple[str, str, str, str]]:
    """This process's POSIX locks on ``files``, as /proc/locks lists them."""
    inodes = {}
    for f in files:
        with_st = os.stat(f)
        inodes[f"{os.major(with_st.st_dev):02x}:{os.minor(with_st.st_dev):02x}:{with_st.st_ino}"] = f.name
    me = str(os.getpid())
    found = []
    for line in Path("/proc/locks").read_text().splitlines():
        parts = line.split()
        if "->" in parts:  # a waiter, not a holder
            continue
        if len(parts) >= 8 and parts[1] == "POSIX" and parts[4] == me and parts[5] in inodes:
            found.append((inodes[parts[5]], parts[3], parts[6], parts[7]))
    return sorted(found)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    p = tmp_path / "state.db"
    with SessionDB(p) as db:
        db.create_session("s1", "cli")
        db.append_message("s1", "user", "kubernetes pods")
    return p


def _wal_holder(p: Path) -> sqlite3.Connection:
    """A connection inside a read transaction: SQLite holds a SHARED lock on the file and
    a read lock in the ``-shm`` for as long as it lasts."""
    conn = sqlite3.connect(p, isolation_level=None)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.execute("BEGIN")
    conn.execute("SELECT count(*) FROM messages").fetchone()
    return conn


def _visit_sessiondb(p: Path) -> None:
    with SessionDB(p) as db:
        assert db.get_session("s1") is not None


def _visit_sessiondb_in_a_thread(p: Path) -> None:
    failures: list[BaseException] = []

    def work() -> None:
        try:
            _visit_sessiondb(p)
        except BaseException as exc:
            failures.append(exc)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert not failures


def _visit_engine_and_unit_of_work(p: Path) -> None:
    engine = create_engine(p)
    try:
        with UnitOfWork(engine, write=False) as uow:
            assert uow.sessions.get("s1") is not None
        with engine.connect() as conn:
            assert SessionRepository(conn).get("s1") is not None
    finally:
        engine.dispose()


def _visit_cli(*args: str) -> Callable[[Path], None]:
    def visit(p: Path) -> None:
        result = run("--db", str(p), *args)
        assert result.code == 0, result.stderr

    return visit


VISITORS: dict[str, Callable[[Path], None]] = {
    "SessionDB": _visit_sessiondb,
    "SessionDB in another thread": _visit_sessiondb_in_a_thread,
    "read-only SessionDB": lambda p: SessionDB(p, read_only=True).close(),
    "engine and UnitOfWork": _visit_engine_and_unit_of_work,
    "migrations.upgrade": lambda p: migrations.upgrade(p),
    "migrations.current": lambda p: migrations.current(p),
    "paths.check_file": lambda p: paths.check_file(p),
    "adopt.needs_adoption": lambda p: adopt.needs_adoption(p),
    "is_zeroed_state_db": lambda p: state_files.is_zeroed_state_db(p, force=True),
    "collect_state_db_stats": lambda p: state_files.collect_state_db_stats(p),
    "cli sessions": _visit_cli("sessions"),
    "cli search": _visit_cli("search", "kubernetes"),
    "cli show": _visit_cli("show", "s1"),
    "cli current": _visit_cli("current"),
    "cli stats": _visit_cli("stats"),
}


@pytest.mark.parametrize("visitor", VISITORS)
def test_a_visit_keeps_every_lock_sqlite_holds_in_wal_mode(visitor: str, store: Path) -> None:
    holder = _wal_holder(store)
    try:
        shm = Path(f"{store}-shm")
        before = _locks_of_this_process(store, shm)
        assert any(name == store.name for name, *_ in before), before  # the SHARED lock on the file
        VISITORS[visitor](store)
        assert _locks_of_this_process(store, shm) == before
    finally:
        holder.close()


@pytest.mark.parametrize("visitor", ["read-only SessionDB", "migrations.upgrade", "migrations.current",
                                     "paths.check_file", "adopt.needs_adoption", "is_zeroed_state_db",
                                     "collect_state_db_stats"])
def test_a_visit_keeps_a_rollback_journal_readers_lock(visitor: str, store: Path) -> None:
    """A DELETE-mode file (Hermes v26 on an affected SQLite) read in a transaction in this
    process: its SHARED lock stays, so no other process rewrites pages under the read."""
    conn = sqlite3.connect(store, isolation_level=None)
    assert conn.execute("PRAGMA journal_mode=DELETE").fetchone()[0] == "delete"
    conn.execute("BEGIN")
    conn.execute("SELECT count(*) FROM messages").fetchone()
    try:
        before = _locks_of_this_process(store)
        assert before
        VISITORS[visitor](store)
        assert _locks_of_this_process(store) == before
    finally:
        conn.execute("ROLLBACK")
        conn.close()


_OTHER_PROCESS = r"""
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=0)
try:
    conn.execute("PRAGMA locking_mode=EXCLUSIVE")
    conn.execute("BEGIN EXCLUSIVE")  # what a closing last connection asks for, to delete the WAL
    print("took the file")
except sqlite3.OperationalError as exc:
    print("refused:", exc)
"""


def test_another_process_cannot_take_the_file_after_a_second_store_came_and_went(store: Path) -> None:
    """The consequence on 7b829f2: after the second SessionDB closed, another process got
    the exclusive lock of a file this process was still reading (and, as the last
    connection, would have checkpointed and deleted the WAL under it)."""
    holder = _wal_holder(store)
    try:
        _visit_sessiondb(store)
        out = subprocess.run([sys.executable, "-c", _OTHER_PROCESS, str(store)], capture_output=True, text=True,
                             check=True).stdout
        assert out.startswith("refused:"), out
        assert holder.execute("SELECT count(*) FROM messages").fetchone()[0] == 1
    finally:
        holder.close()


def test_the_registry_keeps_one_descriptor_per_file_and_frees_removed_ones(tmp_path: Path) -> None:
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"x" * 10)
    b.write_bytes(b"x" * 10)
    assert held_files.read_prefix(a, 4) == b"xxxx"  # also closes what earlier tests left unlinked
    start = held_files.held_count() - 1
    assert held_files.read_prefix(a, 100) == b"x" * 10
    assert held_files.same_bytes(a, b)
    assert held_files.held_count() == start + 2  # one for each file, however often it is read
    a.unlink()
    b.unlink()
    c = tmp_path / "c.bin"
    c.write_bytes(b"y")
    assert held_files.read_prefix(c, 1) == b"y"
    assert held_files.held_count() == start + 1  # the removed files' descriptors were closed


# ---------------------------------------------------------------------- Alembic's global context

def test_threads_migrating_new_files_at_once_do_not_collide(tmp_path: Path) -> None:
    """Alembic's ``context`` is process-global: on 7b829f2 two threads migrating at once
    met ``KeyError: 'config'``. Each thread here runs the whole chain on a file of its own."""
    n = 4
    barrier = threading.Barrier(n)
    failures: list[BaseException] = []

    def open_one(i: int) -> None:
        try:
            barrier.wait()
            with SessionDB(tmp_path / f"s{i}.db") as db:
                db.create_session(f"t{i}", "cli")
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=open_one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    for i in range(n):
        assert migrations.current(tmp_path / f"s{i}.db") == migrations.head()


def test_opening_a_store_at_head_runs_no_alembic_command(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from alembic import command

    ran: list[str] = []
    for name in ("upgrade", "stamp", "downgrade"):
        monkeypatch.setattr(command, name, lambda *a, _n=name, **k: ran.append(_n))
    with SessionDB(store) as db:
        assert db.get_session("s1") is not None
    assert migrations.upgrade(store) == migrations.head()
    assert ran == []


def test_tasks_of_one_event_loop_migrating_at_once_do_not_collide(pg_database: str) -> None:
    """Async migrations on a server run on the loop's greenlets, where a thread lock
    cannot tell two tasks apart: three tenants upgraded by ``asyncio.gather`` take turns."""
    import asyncio

    from hermes_store import aio

    from .aio_support import async_url_for

    url = async_url_for("asyncpg", pg_url=pg_database)
    tenants = ["t_one", "t_two", "t_three"]

    async def main() -> list[str | None]:
        engine = aio.create_async_engine(url)
        try:
            return await asyncio.gather(*(aio.upgrade(engine, schema=t) for t in tenants))
        finally:
            await engine.dispose()

    assert asyncio.run(main()) == [migrations.head()] * 3
    for t in tenants:
        assert migrations.current(pg_database, schema=t) == migrations.head()
