"""The many-process field scenario (issue 29, point 2): the processes, and the checks run afterwards.

Used by ``tests/test_many_processes.py`` (a few seconds) and ``bench/field.py`` (larger
runs, figures printed). One run:

* ``processes`` writer processes on one store (a SQLite file, or a PostgreSQL database).
  Each one's main thread creates sessions, appends messages (each carrying a word no
  other message has, ``w3m117zq``), counts tokens and ends about half of its sessions,
  through one long-lived ``SessionDB`` and, every third session, through a short-lived
  one. Beside it, in the same process, other threads keep opening, using and closing
  further ``SessionDB`` objects, engines (:func:`hermes_store.engine.create_engine`),
  ``UnitOfWork`` objects (reads, and writes that are recorded as acknowledged too) and
  the read-only CLI (:func:`hermes_store.cli.main`, called in-process, so its
  descriptors are this process's own) on the same store.
* one maintenance process: checkpoints (SQLite), ``vacuum()``,
  ``maybe_auto_prune_and_vacuum()`` (it prunes only old ended sessions of a source
  nobody else writes, which it keeps seeding), searches, and closing/reopening its store.

Every process records what it was acknowledged (the id a call returned), and every
exception a caller met, by type and text; on SQLite a thread of each also scans
``/proc/self/fd`` for a descriptor of the database, its ``-wal`` or its ``-shm`` that
was deleted (a process writing through a WAL another one removed).

Run as a script, it is one process of the scenario::

    python tests/many_process_worker.py writer|maint TARGET RESULT.json SECONDS INDEX

:func:`run_field` starts them all and waits; :func:`verify` reads the store afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

#: Words mixed into the messages (so searches and the indexes have common terms too),
#: and a CJK phrase now and then, which feeds the short-CJK (bigram) index.
FILLER = ("kubernetes", "rollout", "deploy", "timeout", "database", "migration", "helm", "retry", "cache",
          "latency", "config", "token")
CJK = ("数据库迁移", "部署超时", "缓存", "检索")
#: The source of the old, ended sessions the maintenance process seeds for auto-prune to delete.
OLD_SOURCE = "field-old"
#: The writers' source.
SOURCE = "field"
#: A writer goes on past its time until this many messages were acknowledged to it, and the
#: maintenance process until it went through each of its steps once (within OVERTIME_S).
MIN_ACKS = 5
OVERTIME_S = 120.0
#: CLI error codes (``--json``) that mean a raw driver or unexpected error reached the caller.
RAW_CLI_CODES = frozenset({"database_error", "unexpected", "os_error"})


def is_sqlite(target: str) -> bool:
    return "://" not in target or target.startswith("sqlite")


# ---------------------------------------------------------------------------- recording

class Record:
    """What one process saw: acknowledged writes, errors met, deleted files held open."""

    def __init__(self, role: str, index: int) -> None:
        self.role, self.index, self.pid = role, index, os.getpid()
        self.lock = threading.Lock()
        self.acks: list[list[Any]] = []  # [message id, word, session id]
        self.sessions: list[str] = []  # sessions whose create_session returned
        self.ended: list[str] = []  # sessions whose end_session returned
        self.tokens: dict[str, list[int]] = {}  # session -> [acknowledged input tokens, attempted]
        self.errors: list[dict[str, Any]] = []
        self.deleted_fds: set[str] = set()
        self.counts: dict[str, int] = {}

    def ack(self, mid: int, word: str, sid: str) -> None:
        with self.lock:
            self.acks.append([int(mid), word, sid])

    def count(self, what: str) -> None:
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    def error(self, op: str, exc: BaseException) -> None:
        from hermes_store import errors

        entry = {"op": op, "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
                 "text": str(exc)[:400], "typed": isinstance(exc, errors.HermesStoreError),
                 "locked": isinstance(exc, errors.DatabaseLockedError)}
        if not entry["typed"]:
            entry["traceback"] = "".join(traceback.format_exception(exc))[-3000:]
        with self.lock:
            self.errors.append(entry)

    def reported(self, op: str, type_name: str, text: str) -> None:
        """An error reported rather than raised (a CLI exit code, auto-prune's ``error``)."""
        with self.lock:
            self.errors.append({"op": op, "type": type_name, "text": text[:400], "typed": _typed_name(type_name),
                                "locked": type_name in ("DatabaseLockedError", "database_locked")})

    def dump(self, path: str) -> None:
        with self.lock:
            data = {"role": self.role, "index": self.index, "pid": self.pid, "acks": self.acks,
                    "sessions": self.sessions, "ended": self.ended, "tokens": self.tokens,
                    "errors": self.errors, "deleted_fds": sorted(self.deleted_fds), "counts": self.counts}
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:  # our own result file, not the database
            json.dump(data, f)
        os.replace(tmp, path)


def _typed_name(name: str) -> bool:
    """A reported error's type (a class name, or a CLI ``--json`` code) is one of ours."""
    from hermes_store import errors

    if name in RAW_CLI_CODES:
        return False
    cls = getattr(errors, name, None)
    if isinstance(cls, type):
        return issubclass(cls, errors.HermesStoreError)
    return name.islower()  # any other CLI code names a typed error (error_code of a HermesStoreError) or a refusal


# ---------------------------------------------------------------------------- the CLI, in-process

class _PerThreadStream:
    """``sys.stdout``/``sys.stderr`` stand-in: what a thread that registered a buffer writes
    goes there (the CLI thread), everything else to the real stream."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, real: Any) -> None:
        self.real = real
        self.buffers: dict[int, list[str]] = {}

    def write(self, s: str) -> int:
        if not isinstance(s, str):  # as a text stream: click probes with ``write(b"")``
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        buf = self.buffers.get(threading.get_ident())
        if buf is None:
            return self.real.write(s)
        buf.append(s)
        return len(s)

    def flush(self) -> None:
        if threading.get_ident() not in self.buffers:
            self.real.flush()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True


_STREAMS: tuple[_PerThreadStream, _PerThreadStream] | None = None


def _cli(args: list[str]) -> tuple[int, str, str]:
    """``hermes-store ARGS`` in this process and thread: (exit code, stdout, stderr)."""
    from hermes_store.cli import main

    assert _STREAMS is not None
    out: list[str] = []
    err: list[str] = []
    me = threading.get_ident()
    _STREAMS[0].buffers[me], _STREAMS[1].buffers[me] = out, err
    try:
        code = main(args)
    finally:
        del _STREAMS[0].buffers[me], _STREAMS[1].buffers[me]
    return code, "".join(out), "".join(err)


def _install_streams() -> None:
    global _STREAMS
    _STREAMS = (_PerThreadStream(sys.stdout), _PerThreadStream(sys.stderr))
    sys.stdout, sys.stderr = _STREAMS


# ---------------------------------------------------------------------------- processes

class Worker:
    def __init__(self, role: str, target: str, result: str, seconds: float, index: int) -> None:
        self.role, self.target, self.result, self.index = role, target, result, index
        self.sqlite = is_sqlite(target)
        self.rec = Record(role, index)
        self.deadline = time.monotonic() + seconds
        self.rng = random.Random(f"{index}-{os.getpid()}")
        self.stop = threading.Event()
        self.words = 0

    # helpers -----------------------------------------------------------------------
    def running(self, done_enough: bool = True) -> bool:
        """Until the deadline; past it, until ``done_enough`` (a busy machine may starve a
        process for its whole time), within a generous cap."""
        now = time.monotonic()
        return now < self.deadline or (not done_enough and now < self.deadline + OVERTIME_S)

    def attempt(self, op: str, fn: Callable[[], Any]) -> tuple[bool, Any]:
        try:
            value = fn()
        except Exception as exc:  # every error a caller meets is recorded, by type and text
            self.rec.error(op, exc)
            return False, None
        self.rec.count(op)
        return True, value

    def open_store(self, op: str) -> Any:
        from hermes_store import SessionDB

        ok, db = self.attempt(op, lambda: SessionDB(self.target))
        return db if ok else None

    def close_store(self, db: Any, op: str) -> None:
        if db is not None:
            self.attempt(op, db.close)

    def word(self) -> str:
        self.words += 1
        return f"w{self.index}m{self.words}zq"

    def content(self, word: str) -> str:
        parts = [word, *self.rng.sample(FILLER, 4)]
        if self.rng.random() < 0.25:
            parts.append(self.rng.choice(CJK))
        self.rng.shuffle(parts)
        return " ".join(parts)

    def pause(self, low: float, high: float) -> None:
        self.stop.wait(self.rng.uniform(low, high))

    # threads -----------------------------------------------------------------------
    def scan_fds(self) -> None:
        """Every 20 ms: a descriptor of this process on a deleted database, -wal or -shm."""
        base = os.path.realpath(self.target)
        names = (base, base + "-wal", base + "-shm", base + "-journal")
        while not self.stop.is_set():
            self._scan_once(names)
            self.stop.wait(0.02)
        self._scan_once(names)

    def _scan_once(self, names: tuple[str, ...]) -> None:
        with contextlib.suppress(OSError):
            for fd in os.listdir("/proc/self/fd"):
                try:
                    link = os.readlink(f"/proc/self/fd/{fd}")
                except OSError:
                    continue
                if link.endswith(" (deleted)") and link[: -len(" (deleted)")] in names:
                    with self.rec.lock:
                        self.rec.deleted_fds.add(link)

    def side_stores(self) -> None:
        """Open, use and close further SessionDB objects, engines and units of work."""
        from sqlalchemy import text

        from hermes_store.engine import create_engine
        from hermes_store.uow import UnitOfWork

        while not self.stop.is_set():
            kind = self.rng.choice(("sessiondb", "sessiondb", "engine", "uow_read", "uow_write"))
            if kind == "sessiondb":
                db = self.open_store("side: SessionDB()")
                if db is not None:
                    self.attempt("side: session_count", db.session_count)
                    self.attempt("side: search_messages", lambda db=db: db.search_messages(self.rng.choice(FILLER), limit=5))
                    self.attempt("side: list_sessions_rich", lambda db=db: db.list_sessions_rich(limit=10))
                    self.close_store(db, "side: SessionDB.close")
            else:
                ok, engine = self.attempt("side: create_engine", lambda: create_engine(self.target))
                if not ok:
                    continue
                try:
                    if kind == "engine":
                        def read(engine: Any = engine) -> Any:
                            with engine.connect() as conn:
                                return conn.execute(text("SELECT count(*) FROM messages")).scalar()
                        self.attempt("side: engine read", read)
                    elif kind == "uow_read":
                        def uow_read(engine: Any = engine) -> Any:
                            with UnitOfWork(engine, write=False) as uow:
                                return uow.sessions.get(f"w{self.index}s1")
                        self.attempt("side: UnitOfWork read", uow_read)
                    else:
                        self.uow_write(engine)
                finally:
                    self.attempt("side: engine.dispose", engine.dispose)
            self.pause(0.02, 0.15)

    def uow_write(self, engine: Any) -> None:
        from hermes_store.uow import UnitOfWork

        with self.rec.lock:
            n = self.rec.counts.get("side: UnitOfWork write", 0) + 1
        sid = f"w{self.index}u{n}-{self.rng.randrange(10**9)}"
        word = self.word()

        def write() -> int:
            with UnitOfWork(engine) as uow:
                uow.sessions.create(sid, SOURCE)
                return int(uow.messages.append(sid, "user", self.content(word)))

        ok, mid = self.attempt("side: UnitOfWork write", write)
        if ok:  # acknowledged once the block committed
            with self.rec.lock:
                self.rec.sessions.append(sid)
            self.rec.ack(mid, word, sid)

    def side_cli(self) -> None:
        """The read-only CLI on the same store, in this process."""
        where = ["--db", self.target] if self.sqlite else ["--url", self.target]
        while not self.stop.is_set():
            cmd = self.rng.choice((["sessions", "--limit", "5"], ["search", self.rng.choice(FILLER)], ["stats"],
                                   ["current"]))
            try:
                code, _out, err = _cli([*where, "--json", *cmd])
            except Exception as exc:  # main() promises an exit code, never an exception
                self.rec.error(f"cli: {cmd[0]}", exc)
                continue
            if code == 0:
                self.rec.count(f"cli: {cmd[0]}")
            else:
                self.rec.reported(f"cli: {cmd[0]} (exit {code})", *_cli_error(err))
            self.pause(0.02, 0.15)

    # roles -------------------------------------------------------------------------
    def writer(self) -> None:
        store = None
        k = 0
        while self.running(done_enough=len(self.rec.acks) >= MIN_ACKS):
            if store is None:
                store = self.open_store("writer: SessionDB()")
                if store is None:
                    self.pause(0.05, 0.1)
                    continue
            k += 1
            sid = f"w{self.index}s{k}"
            short = k % 3 == 0
            db = self.open_store("writer: short-lived SessionDB()") if short else store
            if db is None:
                continue
            try:
                self.one_session(db, sid)
            finally:
                if short:
                    self.close_store(db, "writer: short-lived close")
        if store is not None:
            self.close_store(store, "writer: close")

    def one_session(self, db: Any, sid: str) -> None:
        ok, _ = self.attempt("writer: create_session", lambda: db.create_session(sid, SOURCE, model="field-model"))
        if not ok:
            return
        with self.rec.lock:
            self.rec.sessions.append(sid)
            self.rec.tokens[sid] = [0, 0]
        for j in range(self.rng.randint(3, 8)):
            word = self.word()
            role = "user" if j % 2 == 0 else "assistant"
            ok, mid = self.attempt("writer: append_message",
                                   lambda role=role, word=word: db.append_message(sid, role, self.content(word)))
            if ok:
                self.rec.ack(mid, word, sid)
            if j % 2:
                with self.rec.lock:
                    self.rec.tokens[sid][1] += 7
                ok, _ = self.attempt("writer: update_token_counts",
                                     lambda: db.update_token_counts(sid, input_tokens=7, output_tokens=3,
                                                                    model="field-model"))
                if ok:
                    with self.rec.lock:
                        self.rec.tokens[sid][0] += 7
        if self.rng.random() < 0.5:
            ok, _ = self.attempt("writer: end_session", lambda: db.end_session(sid, "user_exit"))
            if ok:
                with self.rec.lock:
                    self.rec.ended.append(sid)

    def maint(self) -> None:
        from hermes_store.engine import create_engine

        store = None
        _ok, engine = self.attempt("maint: create_engine", lambda: create_engine(self.target))
        step = 0
        while self.running(done_enough=step >= 6):
            if store is None:
                store = self.open_store("maint: SessionDB()")
                if store is None:
                    self.pause(0.05, 0.1)
                    continue
            step += 1
            what = step % 6
            if what == 0:
                self.seed_old(engine)
            elif what == 1 and self.sqlite and engine is not None:
                mode = self.rng.choice(("PASSIVE", "FULL", "RESTART", "TRUNCATE"))

                def checkpoint(mode: str = mode) -> Any:
                    with engine.connect() as conn:
                        return conn.exec_driver_sql(f"PRAGMA wal_checkpoint({mode})").fetchall()
                self.attempt(f"maint: wal_checkpoint({mode})", checkpoint)
            elif what == 2:
                self.attempt("maint: vacuum", store.vacuum)
            elif what == 3:
                ok, out = self.attempt("maint: maybe_auto_prune_and_vacuum",
                                       lambda store=store: store.maybe_auto_prune_and_vacuum(
                                           retention_days=30, min_interval_hours=0, min_vacuum_interval_days=0))
                if ok and out.get("error"):
                    name, _, msg = str(out["error"]).partition(": ")
                    self.rec.reported("maint: maybe_auto_prune_and_vacuum (reported)", name, msg)
                elif ok and out.get("pruned"):
                    self.rec.count("maint: pruned sessions")
            elif what == 4:
                for q in self.rng.sample(FILLER, 3):
                    self.attempt("maint: search_messages", lambda q=q, store=store: store.search_messages(q, limit=20))
                self.attempt("maint: search_messages (CJK)",
                             lambda store=store: store.search_messages(self.rng.choice(CJK)))
            else:  # closing a store: its checkpoint, and a fresh open next round
                self.close_store(store, "maint: close")
                store = None
            self.pause(0.01, 0.05)
        if store is not None:
            self.close_store(store, "maint: close")
        if engine is not None:
            self.attempt("maint: engine.dispose", engine.dispose)

    def seed_old(self, engine: Any) -> None:
        """An ended session of 200 days ago, for the next auto-prune to delete."""
        from sqlalchemy import text

        from hermes_store.uow import UnitOfWork

        if engine is None:
            return
        old = time.time() - 200 * 86400
        sid = f"old-{self.rng.randrange(10**12)}"

        def seed() -> None:
            with UnitOfWork(engine) as uow:
                uow.sessions.create(sid, OLD_SOURCE, started_at=old)
                uow.messages.append(sid, "user", "an old message about kubernetes", timestamp=old)
                uow.conn.execute(text("UPDATE sessions SET ended_at = :t, end_reason = 'old' WHERE id = :id"),
                                 {"t": old + 60, "id": sid})
        self.attempt("maint: seed old session", seed)

    def run(self) -> None:
        threads: list[threading.Thread] = []
        if self.sqlite and os.path.isdir("/proc/self/fd"):
            threads.append(threading.Thread(target=self.scan_fds, name="fd-scan", daemon=True))
        if self.role == "writer":
            threads += [threading.Thread(target=self.side_stores, name=f"side-{i}", daemon=True) for i in range(2)]
            threads.append(threading.Thread(target=self.side_cli, name="side-cli", daemon=True))
        for t in threads:
            t.start()
        try:
            (self.writer if self.role == "writer" else self.maint)()
        except BaseException as exc:
            self.rec.error(f"{self.role}: crashed", exc)
        finally:
            self.stop.set()
            for t in threads:
                t.join(timeout=60)
            self.rec.dump(self.result)


def _cli_error(err: str) -> tuple[str, str]:
    """(code, message) of the CLI's ``--json`` error line on stderr."""
    for line in reversed(err.strip().splitlines()):
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                return str(doc.get("code")), str(doc.get("error"))
    return "unexpected", err.strip()[-400:] or "(no error line)"


def _import_first() -> None:
    """Import what the threads use before they start: two threads importing the same
    package's modules at once can meet a partially initialized module (a Python hazard,
    not the store's), which would be counted as an error here."""
    import importlib

    for name in ("sqlalchemy", "sqlalchemy.orm", "hermes_store", "hermes_store.engine", "hermes_store.uow",
                 "hermes_store.cli", "hermes_store.cli._common", "hermes_store.cli.browse",
                 "hermes_store.cli.schema"):
        importlib.import_module(name)


def main(argv: list[str]) -> int:
    role, target, result, seconds, index = argv
    _import_first()
    _install_streams()
    Worker(role, target, result, float(seconds), int(index)).run()
    return 0


# ---------------------------------------------------------------------------- the scenario

@dataclass
class FieldResult:
    """One run: every process's record, and what :func:`verify` found."""

    records: list[dict[str, Any]]
    exit_codes: list[int]
    acknowledged: int = 0
    lost: list[Any] = field(default_factory=list)  # acknowledged ids missing, or holding other content
    not_found_by_search: list[Any] = field(default_factory=list)
    duplicates: list[Any] = field(default_factory=list)  # ids acknowledged more than once
    ended_reverted: list[str] = field(default_factory=list)
    sessions_missing: list[str] = field(default_factory=list)
    tokens_wrong: list[Any] = field(default_factory=list)
    integrity: list[str] = field(default_factory=list)  # PRAGMA integrity_check lines (['ok'])
    fts_integrity: dict[str, str] = field(default_factory=dict)  # index -> 'ok' or the error
    deleted_fds: list[Any] = field(default_factory=list)
    raw_errors: list[dict[str, Any]] = field(default_factory=list)
    typed_errors: list[dict[str, Any]] = field(default_factory=list)
    verify_error: str | None = None

    @property
    def locked_errors(self) -> int:
        return sum(1 for e in self.typed_errors if e.get("locked"))

    def summary(self) -> dict[str, Any]:
        return {
            "acknowledged": self.acknowledged, "lost": len(self.lost), "not found by search":
            len(self.not_found_by_search), "duplicates": len(self.duplicates),
            "ended sessions reverted": len(self.ended_reverted), "sessions missing": len(self.sessions_missing),
            "token counts wrong": len(self.tokens_wrong), "raw errors": len(self.raw_errors),
            "typed errors": len(self.typed_errors), "of which DatabaseLockedError": self.locked_errors,
            "deleted files held": len(self.deleted_fds),
            "integrity": "ok" if self.integrity == ["ok"] else "; ".join(self.integrity[:3]) or "n/a",
            "fts integrity": ({k: v for k, v in self.fts_integrity.items() if v != "ok"} or "ok")
            if self.fts_integrity else "n/a",
            "process exit codes": sorted(set(self.exit_codes)),
        }

    def problems(self) -> list[str]:
        """Every broken promise, one line each (empty: the run held)."""
        out = []
        if self.verify_error:
            out.append(f"the store could not be read afterwards: {self.verify_error}")
        if any(self.exit_codes):
            out.append(f"a process exited abnormally: {self.exit_codes}")
        if self.lost:
            out.append(f"{len(self.lost)} of {self.acknowledged} acknowledged messages lost or changed, "
                       f"e.g. {self.lost[:3]}")
        if self.not_found_by_search:
            out.append(f"{len(self.not_found_by_search)} acknowledged words not found by search_messages, "
                       f"e.g. {self.not_found_by_search[:3]}")
        if self.duplicates:
            out.append(f"{len(self.duplicates)} ids acknowledged more than once, e.g. {self.duplicates[:3]}")
        if self.ended_reverted:
            out.append(f"{len(self.ended_reverted)} ended sessions no longer ended, e.g. {self.ended_reverted[:3]}")
        if self.sessions_missing:
            out.append(f"{len(self.sessions_missing)} created sessions missing, e.g. {self.sessions_missing[:3]}")
        if self.tokens_wrong:
            out.append(f"{len(self.tokens_wrong)} sessions' token counts wrong, e.g. {self.tokens_wrong[:3]}")
        if self.integrity and self.integrity != ["ok"]:
            out.append(f"integrity_check: {self.integrity[:5]}")
        bad_fts = {k: v for k, v in self.fts_integrity.items() if v != "ok"}
        if bad_fts:
            out.append(f"FTS integrity-check failed: {bad_fts}")
        if self.deleted_fds:
            out.append(f"processes held deleted database files open: {self.deleted_fds[:5]}")
        if self.raw_errors:
            kinds: dict[str, int] = {}
            for e in self.raw_errors:
                key = f"{e['op']}: {e['type']}: {e['text'][:120]}"
                kinds[key] = kinds.get(key, 0) + 1
            top = sorted(kinds.items(), key=lambda kv: -kv[1])[:8]
            out.append(f"{len(self.raw_errors)} errors reached callers that are not HermesStoreError: "
                       + "; ".join(f"{n}x {k}" for k, n in top))
        return out


def worker_env() -> dict[str, str]:
    """The environment of the processes: this hermes_store first on the path, so they run
    the code the test imported (a worktree, or the checkout)."""
    import hermes_store

    root = str(Path(hermes_store.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def prepare(target: str) -> None:
    """Create (and migrate) the store before the processes start, with one old ended session."""
    from hermes_store import SessionDB

    db = SessionDB(target)
    try:
        db.create_session("seed", SOURCE)
        db.append_message("seed", "user", "the first message")
    finally:
        db.close()


def run_field(target: str, workdir: Path, processes: int = 9, seconds: float = 4.0) -> FieldResult:
    """Run the scenario on ``target`` (a SQLite path or a PostgreSQL URL) and verify the store."""
    workdir.mkdir(parents=True, exist_ok=True)
    prepare(target)
    script = str(Path(__file__).resolve())
    env = worker_env()
    roles = [("writer", i) for i in range(processes)] + [("maint", processes)]
    procs = []
    for role, i in roles:
        out = workdir / f"{role}-{i}.json"
        log = open(workdir / f"{role}-{i}.log", "w", encoding="utf-8")
        procs.append((subprocess.Popen([sys.executable, script, role, target, str(out), str(seconds), str(i)],
                                       env=env, stdout=log, stderr=subprocess.STDOUT), out, log))
    codes = []
    for proc, _out, log in procs:
        try:
            # A guard against a hang, not a timing check: a process that has not ended
            # long after its own deadline is stuck.
            codes.append(proc.wait(timeout=seconds + OVERTIME_S + 300))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
        log.close()
    records = []
    for _proc, out, _log in procs:
        if out.exists():
            records.append(json.loads(out.read_text(encoding="utf-8")))
        else:
            tail = (workdir / (out.stem + ".log")).read_text(encoding="utf-8", errors="replace")[-2000:]
            records.append({"role": out.stem, "acks": [], "sessions": [], "ended": [], "tokens": {},
                            "deleted_fds": [], "counts": {},
                            "errors": [{"op": "process", "type": "no result file", "text": tail, "typed": False,
                                        "locked": False}]})
    result = FieldResult(records=records, exit_codes=codes)
    try:
        verify(target, result)
    except Exception as exc:  # a store that cannot even be read is the finding
        result.verify_error = f"{type(exc).__name__}: {exc}"
    return result


def verify(target: str, result: FieldResult) -> None:
    """Read the store after every process ended and fill ``result``'s findings."""
    from sqlalchemy import create_engine as sa_create_engine

    from hermes_store import SessionDB

    acks = [(a[0], a[1], a[2], r["pid"]) for r in result.records for a in r["acks"]]
    result.acknowledged = len(acks)
    seen: dict[int, tuple[str, int]] = {}
    for mid, word, _sid, pid in acks:
        if mid in seen:
            result.duplicates.append({"id": mid, "first": seen[mid], "again": (word, pid)})
        else:
            seen[mid] = (word, pid)
    for r in result.records:
        result.deleted_fds += [(r.get("role"), r.get("index"), link) for link in r["deleted_fds"]]
        for e in r["errors"]:
            (result.typed_errors if e.get("typed") else result.raw_errors).append({**e, "process": r.get("role")})

    if is_sqlite(target):
        _sqlite_integrity(target, result)
    rows_engine = sa_create_engine(f"sqlite:///{target}" if is_sqlite(target) else target)
    try:
        with rows_engine.connect() as conn:
            stored = {int(i): (c, s) for i, c, s in conn.exec_driver_sql(
                "SELECT id, content, session_id FROM messages").fetchall()}
            sessions = {s: (e, t) for s, e, t in conn.exec_driver_sql(
                "SELECT id, ended_at, input_tokens FROM sessions").fetchall()}
    except Exception as exc:  # an unreadable store: nothing acknowledged can be shown to be there
        result.verify_error = f"reading the rows: {type(exc).__name__}: {str(exc)[:300]}"
        result.lost = [{"id": mid, "word": word, "session": sid, "pid": pid, "stored": "unreadable"}
                       for mid, word, sid, pid in acks]
        return
    finally:
        rows_engine.dispose()
    for mid, word, sid, pid in acks:
        row = stored.get(mid)
        if row is None or word not in (row[0] or "").split() or row[1] != sid:
            result.lost.append({"id": mid, "word": word, "session": sid, "pid": pid,
                                "stored": None if row is None else [(row[0] or "")[:80], row[1]]})
    for r in result.records:
        for sid in r["sessions"]:
            if sid not in sessions:
                result.sessions_missing.append(sid)
        for sid in r["ended"]:
            if sid in sessions and sessions[sid][0] is None:
                result.ended_reverted.append(sid)
        for sid, (acked, attempted) in r["tokens"].items():
            if sid in sessions and not acked <= (sessions[sid][1] or 0) <= attempted:
                result.tokens_wrong.append({"session": sid, "acknowledged": acked, "attempted": attempted,
                                            "stored": sessions[sid][1]})
    try:
        db = SessionDB(target)
    except Exception as exc:
        result.verify_error = f"opening a SessionDB: {type(exc).__name__}: {str(exc)[:300]}"
        return
    try:
        for mid, word, _sid, _pid in acks:
            if mid not in stored:
                continue  # already counted as lost
            try:
                hits = db.search_messages(word, limit=5, fields=("id",))
            except Exception as exc:
                hits = [{"error": f"{type(exc).__name__}: {str(exc)[:200]}"}]
            if not any(h.get("id") == mid for h in hits):
                result.not_found_by_search.append({"id": mid, "word": word, "hits": hits[:3]})
    finally:
        db.close()


def _sqlite_integrity(target: str, result: FieldResult) -> None:
    """``PRAGMA integrity_check``, then each FTS5 index's own ``integrity-check``."""
    import sqlite3

    conn = sqlite3.connect(f"file:{target}?mode=ro", uri=True)
    try:
        result.integrity = [row[0] for row in conn.execute("PRAGMA integrity_check")]
        fts = [row[0] for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL TABLE%fts5%'")]
    except sqlite3.Error as exc:
        result.integrity = result.integrity or [f"{type(exc).__name__}: {exc}"]
        return
    finally:
        conn.close()
    # FTS5's integrity-check writes nothing but is an INSERT: a writable connection.
    conn = sqlite3.connect(target, isolation_level=None)
    try:
        for name in fts:
            try:
                conn.execute(f"INSERT INTO \"{name}\"(\"{name}\") VALUES ('integrity-check')")
                result.fts_integrity[name] = "ok"
            except sqlite3.Error as exc:
                result.fts_integrity[name] = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
