"""Retention apply throughput (issue 34, points 2 and 4): deletion and redaction in batches.

    .venv/bin/python bench/retention.py                 # 10k messages (generated and cached by generate.py)
    .venv/bin/python bench/retention.py --size 200k
    .venv/bin/python bench/retention.py --url postgresql+psycopg://user@host/db   # a fresh database there

The cached ``state.db`` (``bench/generate.py``) is copied to a scratch file (SQLite's
backup API) or, with ``--url``, into a fresh database of that server (``hermes-store
copy``). "Now" is set one day after the corpus's newest message, and two policies are
applied one after the other, each by :func:`hermes_store.operations.apply_retention`
in its default batches (each its own transaction):

* redact: tool outputs and reasoning of the messages older than the median message time;
* delete: every source's ended sessions older than the median end (about half of them).

Printed per phase: wall time, the number of batches and the longest write step (how
long one batch held the lock), sessions/s and messages/s deleted, tool outputs (and
reasoning rows) redacted per second, and the dry run's time beside it.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, text

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from generate import ensure_db, parse_size  # noqa: E402 - bench scripts import their sibling

from hermes_store import SessionDB  # noqa: E402
from hermes_store.copying import copy_history  # noqa: E402
from hermes_store.keys import DAY  # noqa: E402
from hermes_store.operations import UnitOfWorkSteps, apply_retention  # noqa: E402
from hermes_store.repositories.retention import RetentionRepository  # noqa: E402
from hermes_store.uow import UnitOfWork  # noqa: E402

T = TypeVar("T")


def _scratch(source: Path, folder: Path, url: str | None) -> str:
    if url is not None:
        copy_history(str(source), url)
        return url
    target = folder / "state.db"
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    return str(target)


def _median_times(store: SessionDB) -> tuple[float, float, float]:
    with UnitOfWork(store.engine, write=False) as uow:
        assert uow.conn is not None
        prefix = f"{uow.schema}." if uow.schema else ""
        ended = text(f"SELECT ended_at FROM {prefix}sessions WHERE ended_at IS NOT NULL")
        ends = [r[0] for r in uow.conn.execute(ended)]
        stamps = [r[0] for r in uow.conn.execute(text(f"SELECT timestamp FROM {prefix}messages"))]
    return statistics.median(ends), statistics.median(stamps), max(stamps)


class TimedSteps:
    """The steps runner with each write step timed: the longest is how long one batch
    held the write lock (SQLite) or its row locks (a server)."""

    def __init__(self, inner: UnitOfWorkSteps) -> None:
        self.inner = inner
        self.writes: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def write(self, fn: Callable[[Connection], T], *, budget: float | None = None) -> T:
        started = time.perf_counter()
        try:
            return self.inner.write(fn, budget=budget)
        finally:
            self.writes.append(time.perf_counter() - started)


def _phase(label: str, store: SessionDB, now: float, **policy: float) -> None:
    with UnitOfWork(store.engine) as uow:
        for p in RetentionRepository(uow.conn).policies():
            RetentionRepository(uow.conn).remove_policy(p.source)
        RetentionRepository(uow.conn).set_policy("*", **policy)
    steps = TimedSteps(UnitOfWorkSteps(store.engine, now=lambda: now))
    dry = apply_retention(steps, dry_run=True)
    started = time.perf_counter()
    done = apply_retention(steps)
    wall = time.perf_counter() - started
    d = done.as_dict()
    batches = sum(p.batches for p in done.policies)
    longest = max(steps.writes, default=0.0)
    print(f"{label}: {wall:.2f}s in {batches} batches, the longest write {longest * 1000:.0f} ms "
          f"(dry run {dry.seconds:.2f}s)")
    if d["sessions_deleted"]:
        print(f"  deleted  {d['sessions_deleted']:>9,} sessions  {d['sessions_deleted'] / wall:>10,.0f} sessions/s")
        print(f"           {d['messages_deleted']:>9,} messages  {d['messages_deleted'] / wall:>10,.0f} messages/s"
              f"  (~{dry.total('bytes_deleted') / 1e6:.1f} MB of text)")
    if d["tool_outputs_redacted"] or d["reasoning_redacted"]:
        print(f"  redacted {d['tool_outputs_redacted']:>9,} tool outputs {d['tool_outputs_redacted'] / wall:>8,.0f}/s"
              f", {d['reasoning_redacted']:,} reasoning rows {d['reasoning_redacted'] / wall:,.0f}/s"
              f"  (~{dry.total('bytes_redacted') / 1e6:.1f} MB of text)")
    assert dry.total("sessions_deleted") == d["sessions_deleted"]
    assert dry.total("tool_outputs_redacted") == d["tool_outputs_redacted"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="10k", help="messages in the generated corpus (10k, 200k, 1M)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--url", help="a fresh PostgreSQL database to run on instead of a SQLite file")
    args = ap.parse_args(argv)
    source, _meta = ensure_db(parse_size(args.size), args.seed)
    with tempfile.TemporaryDirectory(prefix="hs-retention-") as folder:
        target = _scratch(source, Path(folder), args.url)
        with SessionDB(target) as store:
            end_median, stamp_median, newest = _median_times(store)
            now = newest + DAY
            print(f"corpus: {source.name} on {store.engine.dialect.name}; now = newest message + 1 day")
            _phase("redact", store, now, redact_after_days=(now - stamp_median) / DAY)
            _phase("delete", store, now, delete_after_days=(now - end_median) / DAY)
    return 0


if __name__ == "__main__":
    sys.exit(main())
