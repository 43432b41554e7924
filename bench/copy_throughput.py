"""Copy throughput: a generated state.db to PostgreSQL and back (``hermes-store copy``).

    .venv/bin/python bench/copy_throughput.py --quick     # 10k messages
    .venv/bin/python bench/copy_throughput.py             # 200k messages (generated and cached by generate.py)
    .venv/bin/python bench/copy_throughput.py --size 1M --url postgresql+psycopg://user@host/postgres

(Not ``bench/copy.py``: every script in this folder has it first on its path, where a
``copy.py`` would stand in for the standard library's ``copy`` module.)

The server is ``--url``, else ``$HERMES_STORE_BENCH_PG_URL``, else ``$HERMES_STORE_TEST_PG_URL``
(``scripts/pg-test-server start`` exports it); a fresh database is created on it for the
run and dropped afterwards. Three legs, each in a fresh process so its memory is its own:

* ``file → server``: the cached ``state.db`` into the empty server database;
* ``server → file``: that database back into a new ``state.db``;
* ``file → file``: the same file into a new ``state.db``, for reference.

Per leg: wall time, messages per second (over the whole run, and over the copy phase
alone, without index catch-up and verification), the time of each phase, the peak RSS
(``ru_maxrss``), and the RSS growth while copying after a tenth of the sessions against
at the end (flat memory: the end is not larger than the first tenth, give or take the
allocator), with the peaks of the index catch-up and the verification, which work in
fixed-size chunks. The legs' checksums must agree: the file that came back holds
exactly what went out.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (str(ROOT), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import generate

OUT = generate.OUT
URL_ENVS = ("HERMES_STORE_BENCH_PG_URL", "HERMES_STORE_TEST_PG_URL")


def _rss_kib() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def worker(src: str, dst: str, batch: int) -> dict[str, Any]:
    """One copy in this (fresh) process, with its memory sampled at every transaction."""
    from hermes_store.copying import copy_history

    rss0 = _rss_kib()
    peaks: dict[str, int] = {}
    tenth: dict[str, Any] = {}

    def progress(stage: str, done: int, total: int | None) -> None:
        rss = _rss_kib()
        peaks[stage] = max(peaks.get(stage, rss0), rss)
        if stage == "sessions" and total and not tenth and done >= total / 10:
            tenth.update(sessions=done, rss_growth_mib=(peaks[stage] - rss0) / 1024)

    t0 = time.perf_counter()
    report = copy_history(src, dst, batch=batch, progress=progress)
    seconds = time.perf_counter() - t0
    end = max(_rss_kib(), *peaks.values())
    return {
        "seconds": seconds,
        "phases": report.seconds,
        "sessions": report.sessions_copied,
        "messages": report.messages_copied,
        "indexed_rows": report.indexed_rows,
        "ok": report.ok,
        "source_checksum": report.source_checksum,
        "destination_checksum": report.destination_checksum,
        "rss_start_mib": rss0 / 1024,
        "rss_growth_mib": (end - rss0) / 1024,
        #: RSS growth at the highest point of each stage (copying, index catch-up, verifying).
        "stage_growth_mib": {k: (v - rss0) / 1024 for k, v in peaks.items() if k in ("sessions", "index", "verify")},
        "tenth": tenth,
        "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run_leg(name: str, src: str, dst: str, batch: int) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker", src, dst, str(batch)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr[-3000:])
        raise SystemExit(f"copy leg {name} failed")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    copy_s = res["phases"].get("copy") or res["seconds"]
    tenth, stages = res["tenth"] or {}, res["stage_growth_mib"]
    print(f"  {name:<15} {res['seconds']:8.1f} s  {res['messages'] / res['seconds']:>8,.0f} msg/s overall  "
          f"{res['messages'] / copy_s:>8,.0f} msg/s copying  peak RSS {res['maxrss_mib']:6.1f} MiB")
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in res["phases"].items() if k != "total")
    print(f"  {'':<15} phases: {phases}; {res['messages']:,} messages, {res['sessions']:,} sessions, "
          f"{res['indexed_rows']:,} rows indexed; verified {'ok' if res['ok'] else 'MISMATCH'}")
    print(f"  {'':<15} RSS growth while copying {tenth.get('rss_growth_mib', 0):.1f} MiB at a tenth -> "
          f"{stages.get('sessions', 0):.1f} MiB at the end; index catch-up {stages.get('index', 0):.1f} MiB, "
          f"verifying {stages.get('verify', 0):.1f} MiB")
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10k messages instead of 200k")
    ap.add_argument("--size", help="messages in the generated state.db (10k, 200k, 1M or a number)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", type=int, default=None, help="messages per transaction (default: the library's)")
    ap.add_argument("--url", help="PostgreSQL server URL (a database is created on it and dropped)")
    ap.add_argument("--json", default=None, help="results file (default bench/out/copy-results[-quick].json)")
    ap.add_argument("--_worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args._worker:
        src, dst, batch = args._worker
        print(json.dumps(worker(src, dst, int(batch))))
        return 0

    from sqlalchemy import create_engine as sa_create_engine
    from sqlalchemy.engine import make_url

    from hermes_store.copying import DEFAULT_BATCH
    from run import machine_info

    url = args.url or next((os.environ[e] for e in URL_ENVS if os.environ.get(e)), None)
    if not url:
        raise SystemExit(f"no PostgreSQL server: pass --url or set {' or '.join(URL_ENVS)}")
    n = generate.parse_size(args.size or ("10k" if args.quick else "200k"))
    batch = args.batch or DEFAULT_BATCH
    info = machine_info()
    print("hermes_store copy benchmark" + (" (quick)" if args.quick else ""))
    print(f"  CPU       {info['cpu']} x {info['cores']} logical cores, {info['memory_gib']} GiB RAM")
    print(f"  platform  {info['platform']}   load average (1 min) at start: {info['loadavg_1m']}")
    print(f"  versions  Python {info['python']}, SQLite {info['sqlite']}, SQLAlchemy {info['sqlalchemy']}, "
          f"hermes_store {info['hermes_store']} @ {info['commit']}")
    path, meta = generate.ensure_db(n, args.seed, progress=print)
    print(f"  data      {path.name}: {meta['messages']:,} messages, {meta['sessions']:,} sessions, "
          f"{meta['bytes'] / 2**20:,.0f} MiB; batch {batch:,} messages per transaction")
    print()

    admin = sa_create_engine(url, isolation_level="AUTOCOMMIT")
    name = f"hs_bench_copy_{uuid.uuid4().hex[:12]}"
    server = make_url(url).set(database=name).render_as_string(hide_password=False)
    back = OUT / f"copy-back-{n}.db"
    again = OUT / f"copy-file-{n}.db"
    results: dict[str, Any] = {"machine": info, "messages": meta["messages"], "sessions": meta["sessions"],
                               "batch": batch, "legs": {}}
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        for leftover in (back, again):
            for suffix in ("", "-wal", "-shm"):
                Path(f"{leftover}{suffix}").unlink(missing_ok=True)
        legs = results["legs"]
        legs["file -> server"] = run_leg("file -> server", str(path), server, batch)
        legs["server -> file"] = run_leg("server -> file", server, str(back), batch)
        legs["file -> file"] = run_leg("file -> file", str(path), str(again), batch)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
        for leftover in (back, again):
            for suffix in ("", "-wal", "-shm"):
                Path(f"{leftover}{suffix}").unlink(missing_ok=True)
    sums = {leg["source_checksum"] for leg in results["legs"].values()} | {
        leg["destination_checksum"] for leg in results["legs"].values()}
    same = len(sums) == 1 and all(leg["ok"] for leg in results["legs"].values())
    # Flat: copying the whole file needs no more memory than its first tenth (+ an
    # allowance for the allocator); index catch-up and verification work in fixed chunks.
    flat = all(leg["stage_growth_mib"].get("sessions", 0) <= (leg["tenth"] or {}).get("rss_growth_mib", 0) * 1.5 + 16
               for leg in results["legs"].values())
    print()
    print(f"  round trip exact (one checksum on every side): {'yes' if same else 'NO'}")
    print(f"  memory flat while copying (end <= 1.5 x a tenth + 16 MiB): {'yes' if flat else 'NO'}")
    load = os.getloadavg()[0]
    if load > (info["cores"] or 1):
        print(f"  note: load average {load:.1f} is above the {info['cores']} cores; figures are noisy")
    results.update({"round_trip_exact": same, "memory_flat": flat})
    out = Path(args.json) if args.json else OUT / f"copy-results{'-quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"  results written to {out}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
