"""How long ``hermes-store --version`` and ``--help`` take to start (issue 21, point 5).

Each figure is the median wall time of N runs, each in a fresh process, next to the
floor every Python program pays (``python -c pass``) and the cost of importing the
package itself (``python -c "import hermes_store"``), which the console script does
before any of the command line's own code runs. Two library imports are timed beside them
(issue 31, point 5): ``from hermes_store import SessionDB`` (the sync store, which must
load no PostgreSQL or async module for a SQLite file) and ``import hermes_store.aio``.

    python bench/cli_startup.py            # 15 runs each
    python bench/cli_startup.py -n 31 --json
    python bench/cli_startup.py --exe /path/to/venv/bin/hermes-store

The target is under 0.3 s for --version and --help.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_SECONDS = 0.3


def timed(argv: list[str], runs: int, env: dict[str, str]) -> list[float]:
    """Wall seconds of ``runs`` fresh processes of ``argv`` (one warm-up run first, not counted)."""
    out = []
    for i in range(runs + 1):
        started = time.perf_counter()
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode(errors='replace')}")
        if i:
            out.append(elapsed)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--runs", type=int, default=15, help="runs per command (default 15)")
    parser.add_argument("--exe", type=Path, default=Path(sys.executable).with_name("hermes-store"),
                        help="the console script (default: the one beside this Python)")
    parser.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    args = parser.parse_args()
    if not args.exe.exists():
        parser.error(f"{args.exe} does not exist (pip install -e . first)")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "0"}
    python = sys.executable
    cases = [
        ("python -c pass (floor)", [python, "-c", "pass"]),
        ("python -c 'import hermes_store'", [python, "-c", "import hermes_store"]),
        ("from hermes_store import SessionDB", [python, "-c", "from hermes_store import SessionDB"]),
        ("import hermes_store.aio", [python, "-c", "import hermes_store.aio"]),
        ("hermes-store --version", [str(args.exe), "--version"]),
        ("hermes-store --help", [str(args.exe), "--help"]),
    ]
    rows = []
    for label, argv in cases:
        times = timed(argv, args.runs, env)
        rows.append({"case": label, "median_s": round(statistics.median(times), 4), "min_s": round(min(times), 4),
                     "max_s": round(max(times), 4), "runs": len(times)})
    floor = rows[0]["median_s"]
    for row in rows:
        row["over_floor_s"] = round(row["median_s"] - floor, 4)
    verdict = {row["case"]: row["median_s"] < TARGET_SECONDS for row in rows if row["case"].startswith("hermes-store")}
    if args.json:
        print(json.dumps({"python": sys.version.split()[0], "target_s": TARGET_SECONDS, "rows": rows,
                          "under_target": verdict}, indent=2))
    else:
        print(f"{'case':36} {'median':>8} {'min':>8} {'max':>8} {'over floor':>11}   ({args.runs} runs each)")
        for row in rows:
            print(f"{row['case']:36} {row['median_s']:8.3f} {row['min_s']:8.3f} {row['max_s']:8.3f} "
                  f"{row['over_floor_s']:11.3f}")
        for case, ok in verdict.items():
            print(f"{case}: {'under' if ok else 'OVER'} the {TARGET_SECONDS} s target")
    return 0 if all(verdict.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
