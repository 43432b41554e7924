"""Writer threads in one process on one SQLite file: what a gateway serving many chats does.

``bench/writers.py`` measures writer *processes*; this measures writer *threads* of one
process, the case issue 32 is about: they meet in our in-process writer queue
(:mod:`hermes_store.write_queue`) and take turns instead of meeting SQLite's busy lock
and sleeping. Four shapes, each on a fresh file, in the same run:

* ``shared``: one ``SessionDB`` used by every thread (a gateway's one store);
* ``per-thread``: one ``SessionDB`` per thread on the same file (plugins, workers);
* ``floor-shared``: plain ``sqlite3``, one connection handed from thread to thread under
  a ``threading.Lock`` (how the OpenAI Agents SDK's ``SQLiteSession`` does it);
* ``floor-busy``: plain ``sqlite3``, a connection per thread, ``BEGIN IMMEDIATE`` and
  SQLite's own busy handler (60 s timeout).

Each append inserts the message row and bumps the session's counters in one transaction.
Printed: aggregate messages/s, append p50/p99/max (ms), and the checks (rows and
counters exact). No figure is asserted anywhere; this prints.

    .venv/bin/python bench/threads.py                 # 8 threads x 100 appends, 3 rounds
    .venv/bin/python bench/threads.py --threads 4 8 16 --appends 200
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hermes_store import SessionDB  # noqa: E402

FLOOR_BUSY_TIMEOUT_S = 60.0
TOOL_CALLS = json.dumps([{"id": "call_1", "type": "function",
                          "function": {"name": "terminal", "arguments": "{\"command\": \"ls -la\"}"}}])


def _message(i: int) -> dict[str, Any]:
    """A realistic-enough message: every tenth in CJK, every fifth with a tool call."""
    if i % 10 == 0:
        return {"role": "user", "content": f"请帮我检查一下服务器的日志文件 第{i}条"}
    if i % 5 == 0:
        return {"role": "assistant", "content": "", "tool_calls": TOOL_CALLS}
    return {"role": "assistant", "content": f"Message {i}: the deployment of the kubernetes cluster finished."}


def _drive(threads: int, appends: int, append: Callable[[int, int], None]) -> tuple[float, list[float]]:
    """Run ``threads`` threads of ``appends`` calls each from one barrier; (wall s, latencies ms)."""
    barrier = threading.Barrier(threads + 1)
    latencies: list[list[float]] = [[] for _ in range(threads)]
    failures: list[BaseException] = []

    def body(t: int) -> None:
        barrier.wait()
        mine = latencies[t]
        for i in range(appends):
            start = time.perf_counter()
            try:
                append(t, i)
            except BaseException as exc:  # counted and shown: a bench never hides a failure
                failures.append(exc)
                return
            mine.append((time.perf_counter() - start) * 1000)

    workers = [threading.Thread(target=body, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    start = time.perf_counter()
    for w in workers:
        w.join()
    wall = time.perf_counter() - start
    if failures:
        raise RuntimeError(f"{len(failures)} appends failed, first: {failures[0]!r}")
    return wall, [x for xs in latencies for x in xs]


def _ours(path: Path, threads: int, appends: int, shared: bool) -> tuple[float, list[float], str]:
    stores = [SessionDB(path)] if shared else [SessionDB(path) for _ in range(threads)]
    try:
        for t in range(threads):
            stores[0].create_session(f"t{t}", "cli")
            stores[t % len(stores)].append_message(f"t{t}", "user", "warm-up")

        def append(t: int, i: int) -> None:
            m = _message(i)
            stores[t % len(stores)].append_message(f"t{t}", m["role"], m["content"], tool_calls=m.get("tool_calls"))

        wall, lat = _drive(threads, appends, append)
        check = _check(path, threads, appends)
    finally:
        for s in stores:
            s.close()
    return wall, lat, check


def _floor_schema(conn: sqlite3.Connection) -> None:
    conn.executescript(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
        "CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, source TEXT, message_count INTEGER DEFAULT 0,"
        " tool_call_count INTEGER DEFAULT 0);"
        "CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT, role TEXT,"
        " content TEXT, tool_calls TEXT, timestamp REAL);"
    )


def _floor_append(conn: sqlite3.Connection, sid: str, i: int) -> None:
    m = _message(i)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("UPDATE sessions SET message_count = message_count + 1, tool_call_count = tool_call_count + ?"
                 " WHERE id = ?", (1 if m.get("tool_calls") else 0, sid))
    conn.execute("INSERT INTO messages (session_id, role, content, tool_calls, timestamp) VALUES (?, ?, ?, ?, ?)",
                 (sid, m["role"], m["content"], m.get("tool_calls"), time.time()))
    conn.execute("COMMIT")


def _floor(path: Path, threads: int, appends: int, shared: bool) -> tuple[float, list[float], str]:
    setup = sqlite3.connect(path, isolation_level=None)
    _floor_schema(setup)
    setup.executemany("INSERT INTO sessions (id, source) VALUES (?, 'cli')", [(f"t{t}",) for t in range(threads)])
    setup.close()
    n = 1 if shared else threads
    conns = [sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=FLOOR_BUSY_TIMEOUT_S)
             for _ in range(n)]
    lock = threading.Lock()

    def append(t: int, i: int) -> None:
        if shared:
            with lock:
                _floor_append(conns[0], f"t{t}", i)
        else:
            _floor_append(conns[t], f"t{t}", i)

    try:
        wall, lat = _drive(threads, appends, append)
    finally:
        for c in conns:
            c.close()
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
    counted = conn.execute("SELECT sum(message_count) FROM sessions").fetchone()[0]
    conn.close()
    ok = rows == counted == threads * appends
    return wall, lat, "exact" if ok else f"WRONG rows={rows} counted={counted}"


def _check(path: Path, threads: int, appends: int) -> str:
    conn = sqlite3.connect(path)
    try:
        bad = []
        for t in range(threads):
            rows = conn.execute("SELECT count(*) FROM messages WHERE session_id = ?", (f"t{t}",)).fetchone()[0]
            counted = conn.execute("SELECT message_count FROM sessions WHERE id = ?", (f"t{t}",)).fetchone()[0]
            if not rows == counted == appends + 1:
                bad.append(f"t{t}: rows={rows} counted={counted}")
    finally:
        conn.close()
    return "exact" if not bad else "WRONG " + "; ".join(bad)


SHAPES: dict[str, Callable[[Path, int, int], tuple[float, list[float], str]]] = {
    "shared": lambda p, n, a: _ours(p, n, a, True),
    "per-thread": lambda p, n, a: _ours(p, n, a, False),
    "floor-shared": lambda p, n, a: _floor(p, n, a, True),
    "floor-busy": lambda p, n, a: _floor(p, n, a, False),
}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[8])
    parser.add_argument("--appends", type=int, default=100, help="appends per thread")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per shape (round-robin; best and median shown)")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    args = parser.parse_args(argv)
    broken = False
    print(f"{'threads':>7} {'shape':<13} {'msg/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}  check")
    for threads in args.threads:
        results: dict[str, list[tuple[float, list[float], str]]] = {s: [] for s in args.shapes}
        with tempfile.TemporaryDirectory(prefix="hermes-threads-") as tmp:
            for r in range(args.rounds):
                for shape in args.shapes:
                    path = Path(tmp) / f"{shape}-{r}.db"
                    results[shape].append(SHAPES[shape](path, threads, args.appends))
        for shape, runs in results.items():
            rates = [threads * args.appends / wall for wall, _, _ in runs]
            pooled = [x for _, lat, _ in runs for x in lat]
            checks = {c for _, _, c in runs}
            broken |= checks != {"exact"}
            print(f"{threads:>7} {shape:<13} {statistics.median(rates):>8.0f} {_pct(pooled, 0.5):>7.2f} "
                  f"{_pct(pooled, 0.99):>7.2f} {max(pooled):>7.1f}  {', '.join(sorted(checks))}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
