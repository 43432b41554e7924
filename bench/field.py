"""The many-process field scenario of tests/test_many_processes.py, longer and repeated, with figures.

    .venv/bin/python bench/field.py                                  # 9 writers x 30 s, 5 runs, SQLite
    .venv/bin/python bench/field.py --processes 9 --seconds 30 --runs 5
    .venv/bin/python bench/field.py --backend postgresql             # a fresh database on $HERMES_STORE_TEST_PG_URL
    .venv/bin/python bench/field.py --backend postgresql --url postgresql+psycopg://user@host/postgres

Each run: ``--processes`` writer processes on one fresh store, each with further
``SessionDB`` objects, engines, units of work and the in-process read-only CLI opened and
closed by other threads of the same process, plus one maintenance process (checkpoints,
``vacuum()``, auto-prune, searches); see tests/many_process_worker.py. Printed per run:
messages acknowledged, lost (missing or changed), not found by search, ids acknowledged
twice, raw errors (not a ``HermesStoreError``) and typed ones (how many were
``DatabaseLockedError``), deleted ``-wal``/``-shm`` held open, ``integrity_check`` and the
FTS indexes' ``integrity-check``; ``--verbose`` adds the most frequent errors. Exit 1 when
any run broke a promise. ``--keep`` keeps the SQLite files and the processes' records.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.many_process_worker import FieldResult, run_field


def _pg_database(server: str):  # type: ignore[no-untyped-def]
    from tests.helpers import server_database

    return server_database(server, prefix="hs_field_")


def _top_errors(result: FieldResult, n: int = 6) -> list[str]:
    kinds = Counter(f"{'raw  ' if e in result.raw_errors else 'typed'} {e['op']}: {e['type']}: {e['text'][:100]}"
                    for e in result.raw_errors + result.typed_errors)
    return [f"{count:>6}x {kind}" for kind, count in kinds.most_common(n)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=9, help="writer processes (default 9)")
    ap.add_argument("--seconds", type=float, default=30.0, help="how long each process writes (default 30)")
    ap.add_argument("--runs", type=int, default=5, help="runs, each on a fresh store (default 5)")
    ap.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    ap.add_argument("--url", default=os.environ.get("HERMES_STORE_TEST_PG_URL"),
                    help="PostgreSQL server (default $HERMES_STORE_TEST_PG_URL); each run makes its own database")
    ap.add_argument("--keep", action="store_true", help="keep the SQLite files and the processes' records")
    ap.add_argument("--verbose", "-v", action="store_true", help="print the most frequent errors of each run")
    args = ap.parse_args(argv)
    if args.backend == "postgresql" and not args.url:
        ap.error("--backend postgresql needs --url or $HERMES_STORE_TEST_PG_URL")

    import hermes_store

    try:
        load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "unknown"
    print(f"field scenario: {args.processes} writers + 1 maintenance process, {args.seconds:g} s, "
          f"{args.runs} run(s), {args.backend}; hermes_store from {Path(hermes_store.__file__).parent}; "
          f"load average {load} on {os.cpu_count()} cores")
    cols = ("run", "acked", "lost", "unfound", "dup ids", "raw err", "typed", "locked", "deleted fd", "integrity",
            "fts", "wall s")
    print("  ".join(f"{c:>10}" for c in cols))
    failed = 0
    totals: Counter[str] = Counter()
    base = Path(tempfile.mkdtemp(prefix="hermes-field-"))
    try:
        for run in range(1, args.runs + 1):
            work = base / f"run{run}"
            t0 = time.perf_counter()
            if args.backend == "sqlite":
                result = run_field(str(work / "state.db"), work, args.processes, args.seconds)
            else:
                with _pg_database(args.url) as url:
                    result = run_field(url, work, args.processes, args.seconds)
            wall = time.perf_counter() - t0
            s = result.summary()
            integrity = "ok" if result.integrity == ["ok"] else ("n/a" if not result.integrity else "FAILED")
            fts = "n/a" if not result.fts_integrity else (
                "ok" if set(result.fts_integrity.values()) == {"ok"} else "FAILED")
            row = (run, s["acknowledged"], s["lost"], s["not found by search"], s["duplicates"], s["raw errors"],
                   s["typed errors"], s["of which DatabaseLockedError"], s["deleted files held"], integrity, fts,
                   f"{wall:.1f}")
            print("  ".join(f"{v!s:>10}" for v in row), flush=True)
            for key in ("acknowledged", "lost", "not found by search", "duplicates", "raw errors", "typed errors",
                        "of which DatabaseLockedError", "deleted files held"):
                totals[key] += s[key]
            problems = result.problems()
            if problems:
                failed += 1
                for line in problems:
                    print(f"      ! {line[:600]}")
                if integrity == "FAILED":
                    print(f"      ! integrity_check: {result.integrity[:3]}")
            if args.verbose:
                for line in _top_errors(result):
                    print(f"      {line}")
            if args.keep:
                (work / "summary.json").write_text(json.dumps(s, indent=1, default=str))
    finally:
        if args.keep:
            print(f"kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    print(f"total: {dict(totals)}")
    print(f"{args.runs - failed} of {args.runs} run(s) held every promise")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
