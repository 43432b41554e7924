"""Concurrent writers: 1, 4, 8 and 16 processes appending at the same time.

Each writer is its own process (``multiprocessing``, spawn start method, so nothing of
the parent's connections leaks in). It opens its own store, creates its own sessions,
makes a few warm-up appends (a fresh process's first calls compile statements and read
the schema), waits on a barrier with the others, then appends ``n`` messages one
transaction each, timing every append. Two implementations, each on its own copy of the database:

* ``facade``: ``SessionDB.append_message``, exactly as Hermes calls it (SQLite: ``BEGIN
  IMMEDIATE`` with a 100 ms busy timeout, then jittered retries; PostgreSQL: READ
  COMMITTED, counters updated in SQL, retries on 40001/40P01);
* the floor: plain ``sqlite3`` (``baseline.Baseline.append_message``, ``BEGIN
  IMMEDIATE``; its busy timeout raised to 60 s so that waiting is SQLite's own busy
  handler) or plain psycopg (``pg_baseline.PgBaseline.append_message``), each inserting
  the message row and bumping the session's counters in one transaction.

Reported per run: aggregate throughput (all appends / wall time from the first writer
leaving the barrier to the last one finishing), p50/p99/max latency of single appends
pooled over the writers, the writers' own CPU time per append (Python, driver and, on
SQLite, the database engine itself; a PostgreSQL server's work is not in it), and two
checks read back afterwards: rows lost (appends that raised, or whose row is not
there) and whether every session's ``message_count`` / ``tool_call_count`` is exact.
With more writers than cores, throughput is bounded by CPU: compare the CPU column.

Statements per append (round trips on PostgreSQL; what is counted: bench/meter.py) are
counted after the timed phase: once every writer is done (a second barrier), each makes
:data:`COUNTED_APPENDS` more appends to its warm-up session with a counter attached, so
the timed appends never run with one and the checked sessions get nothing extra.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (str(ROOT), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

WRITER_COUNTS = (1, 4, 8, 16)
SESSIONS_PER_WRITER = 4
#: Appends each writer makes before the barrier (to a session of its own, not counted):
#: a fresh process's first calls compile statements and read the schema.
WARMUP_APPENDS = 5
#: Counted appends per writer after the timed phase: 50 covers one cycle of the facade's
#: periodic work (a WAL checkpoint and index catch-up every 50 writes).
COUNTED_APPENDS = 50
BARRIER_TIMEOUT_S = 300.0
FLOOR_BUSY_TIMEOUT_MS = 60_000


def _plan(messages: list[dict[str, Any]], wid: int, n: int, sids: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """Writer ``wid``'s appends: its sessions in turn, messages from its own offset."""
    return [(sids[i % len(sids)], messages[(wid * 97 + i) % len(messages)]) for i in range(n)]


def session_ids(tag: str, wid: int) -> list[str]:
    return [f"{tag}-w{wid}-s{j}" for j in range(SESSIONS_PER_WRITER)]


def _open(impl: str, backend: str, target: str) -> tuple[Any, Any, Any, Any]:
    """(create_session, append, close, statement meter) for one writer process."""
    import meter

    if impl == "facade":
        from hermes_store import SessionDB

        db = SessionDB(target)
        return (lambda sid: db.create_session(sid, "cli"),
                lambda sid, m: db.append_message(sid, **m), db.close,
                meter.EngineMeter(db.engine, held=lambda: meter.held_connections(db),
                                  settle=lambda: db.wait_for_upkeep(60)))
    if backend == "sqlite":
        from baseline import Baseline

        base = Baseline(target, busy_timeout_ms=FLOOR_BUSY_TIMEOUT_MS)

        def create(sid: str) -> None:
            base.conn.execute("INSERT INTO sessions (id, source, started_at) VALUES (?, 'cli', ?)", (sid, time.time()))

        return create, lambda sid, m: base.append_message(sid, **m), base.close, meter.floor_meter(base)
    from pg_baseline import PgBaseline
    from pg_load import conninfo

    pbase = PgBaseline(conninfo(target))

    def create_pg(sid: str) -> None:
        pbase.conn.execute("INSERT INTO sessions (id, source, started_at) VALUES (%s, 'cli', %s)", (sid, time.time()))

    return create_pg, lambda sid, m: pbase.append_message(sid, **m), pbase.close, meter.floor_meter(pbase)


def worker(impl: str, backend: str, target: str, tag: str, wid: int, n: int, messages: list[dict[str, Any]],
           barrier: Any, out: Any, done: Any = None) -> None:
    """One writer process: set up, wait for the others, append ``n`` messages timing each;
    then, once all are done (``done``), count the statements of a few more appends."""
    error = None
    close = None
    counter = None
    sids = session_ids(tag, wid)
    try:
        create, append, close, counter = _open(impl, backend, target)
        for sid in sids:
            create(sid)
        plan = _plan(messages, wid, n, sids)
        warm = f"{tag}-w{wid}-warmup"
        create(warm)
        for i in range(WARMUP_APPENDS):
            append(warm, messages[(wid * 31 + i) % len(messages)])
    except BaseException as exc:
        error = f"setup: {type(exc).__name__}: {exc}"
    barrier.wait(BARRIER_TIMEOUT_S)
    clock = time.monotonic_ns  # CLOCK_MONOTONIC: comparable across processes
    lat: list[int] = []
    cpu0 = time.process_time()
    t0 = clock()
    if error is None:
        try:
            for sid, m in plan:
                t = clock()
                append(sid, m)
                lat.append(clock() - t)
        except BaseException as exc:
            error = f"append #{len(lat)}: {type(exc).__name__}: {exc}"
    t1 = clock()
    cpu = time.process_time() - cpu0
    stmts = None
    if done is not None:
        try:
            done.wait(BARRIER_TIMEOUT_S + 600)
            if error is None and counter is not None:
                c0 = counter.count
                counter.start()
                try:
                    for i in range(COUNTED_APPENDS):
                        counter.boundary()
                        append(warm, messages[(wid * 53 + i) % len(messages)])
                finally:
                    counter.stop()
                stmts = (counter.count - c0) / COUNTED_APPENDS
        except BaseException as exc:
            stmts = None
            print(f"writer {wid}: counting failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    if close is not None:
        try:
            close()
        except Exception:
            pass
    out.put({"wid": wid, "t0": t0, "t1": t1, "lat": lat, "cpu_s": cpu, "error": error, "stmts": stmts,
             "stmts_unit": getattr(counter, "unit", None)})


def expected_counts(messages: list[dict[str, Any]], tag: str, writers: int, n: int) -> dict[str, tuple[int, int]]:
    """session id -> (messages, tool calls) every writer of a run should leave behind."""
    want: dict[str, list[int]] = {}
    for wid in range(writers):
        sids = session_ids(tag, wid)
        for sid, m in _plan(messages, wid, n, sids):
            c = want.setdefault(sid, [0, 0])
            c[0] += 1
            calls = m.get("tool_calls")
            c[1] += len(calls) if isinstance(calls, list) else 0
    return {k: (v[0], v[1]) for k, v in want.items()}


def read_counts(backend: str, target: str, sids: list[str]) -> dict[str, tuple[int, int, int]]:
    """session id -> (rows in messages, message_count, tool_call_count), read back."""
    if backend == "sqlite":
        import sqlite3

        conn = sqlite3.connect(target)
        try:
            marks = ", ".join("?" * len(sids))
            rows = dict(conn.execute(f"SELECT session_id, count(*) FROM messages WHERE session_id IN ({marks})"
                                     " GROUP BY session_id", sids).fetchall())
            counters = {r[0]: (r[1], r[2]) for r in conn.execute(
                f"SELECT id, message_count, tool_call_count FROM sessions WHERE id IN ({marks})", sids)}
        finally:
            conn.close()
    else:
        import psycopg

        from pg_load import conninfo

        with psycopg.connect(conninfo(target)) as conn:
            rows = dict(conn.execute("SELECT session_id, count(*) FROM messages WHERE session_id = ANY(%s)"
                                     " GROUP BY session_id", (sids,)).fetchall())
            counters = {r[0]: (r[1], r[2]) for r in conn.execute(
                "SELECT id, message_count, tool_call_count FROM sessions WHERE id = ANY(%s)", (sids,))}
    return {sid: (rows.get(sid, 0), *counters.get(sid, (None, None))) for sid in sids}


def run(impl: str, backend: str, target: str, tag: str, writers: int, n: int,
        messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Start ``writers`` processes together; return the aggregate figures and checks."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(writers)
    done = ctx.Barrier(writers)
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(impl, backend, target, tag, w, n, messages, barrier, out, done))
             for w in range(writers)]
    for p in procs:
        p.start()
    results = []
    deadline = time.monotonic() + BARRIER_TIMEOUT_S + 600
    while len(results) < writers:
        try:
            results.append(out.get(timeout=5))
        except queue_mod.Empty:
            if time.monotonic() > deadline or not any(p.is_alive() for p in procs):
                break
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.terminate()
    errors = [r["error"] for r in results if r["error"]]
    if len(results) < writers:
        errors.append(f"{writers - len(results)} writer(s) died without reporting")
    lat = sorted(x / 1e6 for r in results for x in r["lat"])
    appended = len(lat)
    wall = (max(r["t1"] for r in results) - min(r["t0"] for r in results)) / 1e9 if results else float("nan")
    want = expected_counts(messages, tag, writers, n)
    got = read_counts(backend, target, sorted(want))
    lost = sum(max(want[s][0] - got[s][0], 0) for s in want)
    exact = all(got[s] == (want[s][0], want[s][0], want[s][1]) for s in want)

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, max(0, round(q * len(lat)) - 1))] if lat else float("nan")

    return {
        "impl": impl, "writers": writers, "per_writer": n, "appended": appended, "expected": writers * n,
        "seconds": wall, "per_s": appended / wall if wall else float("nan"),
        "p50_ms": statistics.median(lat) if lat else float("nan"), "p99_ms": pct(0.99),
        "max_ms": lat[-1] if lat else float("nan"), "mean_ms": statistics.fmean(lat) if lat else float("nan"),
        "client_cpu_ms": 1000 * sum(r["cpu_s"] for r in results) / appended if appended else float("nan"),
        "stmts_per_append": (statistics.fmean(counted) if (counted := [r["stmts"] for r in results
                                                                       if r.get("stmts") is not None])
                             else float("nan")),
        "stmts_unit": next((r["stmts_unit"] for r in results if r.get("stmts_unit")), None),
        "lost_rows": lost, "counters_exact": exact, "errors": errors,
        "counter_mismatches": {s: {"want": want[s], "rows/message_count/tool_call_count": got[s]}
                               for s in want if got[s] != (want[s][0], want[s][0], want[s][1])},
    }
