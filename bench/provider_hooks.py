"""What Hermes v30's write hooks cost an append (issue 35), against a plain ``sqlite3`` floor.

    .venv/bin/python bench/provider_hooks.py                 # SQLite file, 2000 appends per case
    .venv/bin/python bench/provider_hooks.py --url postgresql+psycopg://user@host/db   # a server too
    .venv/bin/python bench/provider_hooks.py --appends 5000 --threads 8

Cases, each on a fresh store, interleaved over ``--rounds`` rounds (medians printed):

* ``no hooks``: appends as every store makes them (group commit across threads);
* ``no-op pre``: a pre-commit hook that does nothing (each write its own transaction);
* ``audit pre``: a pre-commit hook that reads one row count in the transaction (the
  kind of check a veto hook makes);
* ``post``: a post-write hook that appends to a list.

Printed per case: appends/s from one thread and from ``--threads`` threads, and the
ratio to ``no hooks``, and the floor measured in the same run (``sqlite3`` on a file of
ours, or ``psycopg`` on a tenant schema of ours: one INSERT, the counter and a COMMIT
per message) with the one-thread ratio of each case to it.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from sqlalchemy.engine import make_url

from hermes_store import SessionDB
from hermes_store.engine import schema_of


def _noop(conn: Any) -> None:
    return None


def _audit(db: SessionDB) -> None:
    """A hook reading the store's own table: named with its tenant schema, as a hook on a
    tenant must (the transaction's connection carries no search_path)."""
    schema = schema_of(db.engine)
    sql = f'SELECT count(*) FROM "{schema}".sessions' if schema else "SELECT count(*) FROM sessions"
    db.add_pre_commit_hook(lambda conn: conn.execute(sql).fetchone())


CASES: dict[str, Callable[[SessionDB], None]] = {
    "no hooks": lambda db: None,
    "no-op pre": lambda db: db.add_pre_commit_hook(_noop),
    "audit pre": _audit,
    "post": lambda db: db.add_post_write_hook(lambda: None),
}


def _appends_per_s(db: SessionDB, n: int, threads: int) -> float:
    db.create_session("b", "cli")
    each = max(1, n // threads)

    def work() -> None:
        for i in range(each):
            db.append_message("b", "user", f"message {i} of the hook bench")

    workers = [threading.Thread(target=work) for _ in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return each * threads / (time.perf_counter() - start)


def _store(target: str | None, tmp: Path, name: str) -> SessionDB:
    if target is None:
        return SessionDB(tmp / f"{name}.db")
    return SessionDB(url=target, schema=f"bench_hooks_{name}")


def _floor(tmp: Path, n: int, name: str) -> float:
    """Plain sqlite3 on a file of ours (the same tables, indexes and search triggers):
    per message one INSERT, the session's counter, one COMMIT, as an append writes."""
    path = tmp / f"floor_{name}.db"
    SessionDB(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('b', 'cli', ?)", (time.time(),))
    start = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)",
                     ("b", "user", f"message {i} of the hook bench", time.time()))
        conn.execute("UPDATE sessions SET message_count = message_count + 1 WHERE id = 'b'")
        conn.execute("COMMIT")
    rate = n / (time.perf_counter() - start)
    conn.close()
    return rate


def _pg_floor(url: str, n: int, name: str) -> float:
    """Plain psycopg on a tenant schema of ours: per message one INSERT, the counter, one COMMIT."""
    schema = f"bench_hooks_floor_{name}"
    SessionDB(url=url, schema=schema).close()
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn) as conn:
        conn.execute(f'INSERT INTO "{schema}".sessions (id, source, started_at) VALUES (%s, %s, %s)',
                     ("b", "cli", time.time()))
        conn.commit()
        start = time.perf_counter()
        for i in range(n):
            conn.execute(f'INSERT INTO "{schema}".messages (session_id, role, content, timestamp) '
                         "VALUES (%s, %s, %s, %s)", ("b", "user", f"message {i} of the hook bench", time.time()))
            conn.execute(f'UPDATE "{schema}".sessions SET message_count = message_count + 1 WHERE id = %s', ("b",))
            conn.commit()
        return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--appends", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url", help="a PostgreSQL URL: each case in a schema of its own there")
    args = parser.parse_args()
    one: dict[str, list[float]] = {c: [] for c in CASES}
    many: dict[str, list[float]] = {c: [] for c in CASES}
    floor: list[float] = []
    with tempfile.TemporaryDirectory(prefix="hs-bench-hooks-") as tmp_name:
        tmp = Path(tmp_name)
        for r in range(args.rounds):
            floor.append(_floor(tmp, args.appends, str(r)) if args.url is None
                         else _pg_floor(args.url, args.appends, str(r)))
            for case, install in CASES.items():
                for threads, out in ((1, one), (args.threads, many)):
                    name = f"{case.replace(' ', '_').replace('-', '')}_{threads}_{r}"
                    db = _store(args.url, tmp, name)
                    try:
                        install(db)
                        out[case].append(_appends_per_s(db, args.appends, threads))
                    finally:
                        db.close()
    base1, baseN = statistics.median(one["no hooks"]), statistics.median(many["no hooks"])
    where = "PostgreSQL" if args.url else "SQLite file"
    print(f"{where}: {args.appends} appends per case, median of {args.rounds} rounds")
    kind = "psycopg on a tenant schema of ours" if args.url else "sqlite3 on our file"
    print(f"floor ({kind}: INSERT, counter, COMMIT per message): {statistics.median(floor):,.0f}/s")
    print(f"{'case':<11} {'1 thread/s':>11} {'x no hooks':>10} {f'{args.threads} threads/s':>12} {'x no hooks':>10}"
          + f" {'1 thr x floor':>13}")
    for case in CASES:
        a, b = statistics.median(one[case]), statistics.median(many[case])
        print(f"{case:<11} {a:>11,.0f} {a / base1:>10.2f} {b:>12,.0f} {b / baseN:>10.2f}"
              f" {a / statistics.median(floor):>13.2f}")


if __name__ == "__main__":
    main()
