"""hermes_store benchmarks: SessionDB vs repositories vs the plain driver, against SPEC §8.

    .venv/bin/python bench/run.py --quick              # < 1 minute: 10k messages, few reps
    .venv/bin/python bench/run.py                      # 200k core benchmarks + 1M export
    .venv/bin/python bench/run.py --sizes 200k         # core benchmarks only at 200k
    .venv/bin/python bench/run.py --profile            # also cProfile the facade per operation
    .venv/bin/python bench/run.py --backend postgresql --quick   # the same on a PostgreSQL server
    .venv/bin/python bench/run.py --only writers       # 1, 4, 8, 16 concurrent writer processes
    .venv/bin/python bench/run.py --quick --async --only async   # hermes_store.aio vs sync vs floors

Every operation runs through three implementations in the same process and run:
``facade`` (``SessionDB``), ``repo`` (``UnitOfWork`` + repositories, the layer under the
facade) and the floor: ``sqlite3`` (bench/baseline.py) on SQLite, ``psycopg``
(bench/pg_baseline.py) on PostgreSQL. Repetitions are interleaved (round-robin,
rotating order) after a warm-up so drift — a growing file, a warming cache — hits all
three alike. See bench/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import gc
import io
import json
import os
import platform
import pstats
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (str(ROOT), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import generate
import pg_load
import meter
import timing
import writers as writers_mod
from baseline import Baseline

OUT = generate.OUT
GROUPS = ("writes", "search", "lineage", "listing", "replay", "writers", "export")
#: Run only when asked for (``--async``, or ``--only async``): the asyncio API (bench/aio_bench.py).
OPT_IN_GROUPS = ("async",)

# Search workload: what people type. Word queries span rare to very common terms.
WORD_QUERIES = [
    "database migration",
    "timeout",
    "connection refused",
    "docker container logs",
    "pytest fixture",
    '"rate limit"',
    "sqlite wal checkpoint",
    "deploy*",
    "kubernetes OR helm",
    "memory leak",
    "segfault",
    "sqlite_rate",
]
# 2 CJK characters: no trigram. Common terms, plus two absent ones (the worst case for a scan).
CJK2_QUERIES = ["数据", "迁移", "测试", "設定", "서버", "冰箱", "벚꽃"]
CJK3_QUERIES = ["数据库", "テスト", "테스트", "データベース"]  # >= 3: trigram index


# --------------------------------------------------------------------------- machine

def machine_info(pg_url: str | None = None) -> dict[str, Any]:
    import sqlalchemy

    import hermes_store

    cpu = timing.cpu_model()
    mem = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = round(int(line.split()[1]) / 1024 / 1024, 1)
    commit = timing.commit_of(ROOT)
    load = None
    with contextlib.suppress(OSError):
        load = os.getloadavg()[0]
    pg: dict[str, Any] = {}
    if pg_url:
        import psycopg

        pg = {"postgresql": pg_load.server_version(pg_url), "psycopg": psycopg.__version__,
              "postgresql_settings": pg_load.server_settings(pg_url)}
    return {
        "loadavg_1m": load,
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": mem,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "sqlalchemy": sqlalchemy.__version__,
        "hermes_store": getattr(hermes_store, "__version__", "?"),
        "commit": commit,
        **pg,
    }


# --------------------------------------------------------------------------- timing

class Stats(dict):
    @classmethod
    def of(cls, samples_ns: list[int], items: int = 1) -> Stats:
        ms = sorted(s / 1e6 for s in samples_ns)
        n = len(ms)
        mean = statistics.fmean(ms)
        return cls(
            n=n, p50_ms=statistics.median(ms), p95_ms=ms[min(n - 1, max(0, round(0.95 * n) - 1))],
            mean_ms=mean, min_ms=ms[0], per_s=(1000.0 / mean) * items if mean else float("inf"), items=items,
        )


def bench(impls: dict[str, Callable[[], Any]], *, reps: int, warmup: int = 1, budget_s: float | None = None,
          min_reps: int = 5, results: dict[str, Any] | None = None, slow_s: float = 5.0,
          meters: dict[str, meter.Meter] | None = None,
          probes: dict[str, dict[str, Any]] | None = None) -> dict[str, list[int]]:
    """Run each implementation ``reps`` times, interleaved round-robin, after ``warmup`` calls.

    With ``budget_s``, an implementation gets only as many repetitions as fit in about
    that time (never fewer than ``min_reps``). An implementation whose warm-up call
    took more than ``slow_s`` is pathological: that call is its only sample. The value
    of each implementation's first call is stored in ``results`` (for correctness checks).

    With ``probes`` (a dict to fill), every implementation then gets a few extra calls
    after the timed loop (:func:`meter.probe`): client CPU per call, and statements per
    call counted by ``meters[name]``. The timed loop itself runs with nothing attached.
    """
    # The plan (warm-up, repetitions, order) is timing.Schedule, shared with aio_bench.abench.
    plan = timing.Schedule(impls, reps=reps, warmup=warmup, budget_s=budget_s, min_reps=min_reps, slow_s=slow_s,
                           results=results)
    clock = time.perf_counter_ns
    for name, fn in plan.warm_ups():
        t = clock()
        value = fn()
        plan.warmed(name, clock() - t, value)
    samples = plan.samples
    for name, fn in plan.timed():
        t = clock()
        fn()
        samples[name].append(clock() - t)
    if probes is not None:
        for name in plan.names:
            probes[name] = meter.probe(impls[name], (meters or {}).get(name), plan.probe_calls(name))
    return samples


def profile_call(fn: Callable[[], Any], reps: int, path: Path, top: int = 30) -> None:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(reps):
        fn()
    prof.disable()
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("cumulative").print_stats(top)
    st.sort_stats("tottime").print_stats(top)
    path.write_text(buf.getvalue())


# --------------------------------------------------------------------------- report

class Report:
    """Figures, SPEC §8 verdicts and correctness checks of one run.

    ``base`` names the floor every ratio is taken against (``sqlite3`` or
    ``psycopg``). SPEC §8's targets are SQLite targets: with ``judged=False``
    (PostgreSQL) they are recorded as ``info``, never PASS/MISS.
    """

    #: Width of the implementation column.
    name_width = 8

    def __init__(self, base: str = "sqlite3", judged: bool = True) -> None:
        self.base = base
        self.judged = judged
        self.rows: list[dict[str, Any]] = []
        self.targets: list[dict[str, Any]] = []
        self.checks: list[str] = []
        self.failures: list[str] = []
        self.notes: list[str] = []

    def add(self, op: str, size: str, samples: dict[str, list[int]], *, items: int = 1, unit: str = "ms",
            extra: dict[str, Any] | None = None, probes: dict[str, dict[str, Any]] | None = None
            ) -> dict[str, Stats]:
        """``probes``: per implementation, client CPU and statements per call (:mod:`meter`),
        printed after the latency and stored with the row."""
        stats = {name: Stats.of(s, items) for name, s in samples.items()}
        base = stats.get(self.base)
        probes = probes or {}
        for name, st in stats.items():
            row = {"op": op, "size": size, "impl": name, **st, "unit": unit, **(extra or {}),
                   **probes.get(name, {})}
            if base and name != self.base:
                row["ratio_p50"] = st["p50_ms"] / base["p50_ms"] if base["p50_ms"] else None
                row["ratio_mean"] = st["mean_ms"] / base["mean_ms"] if base["mean_ms"] else None
            self.rows.append(row)
        self._print(op, size, stats, unit, extra, probes)
        return stats

    def _print(self, op: str, size: str, stats: dict[str, Stats], unit: str, extra: dict[str, Any] | None,
               probes: dict[str, dict[str, Any]] | None = None) -> None:
        base = stats.get(self.base)
        head = f"{op} [{size}]" + (f"  ({', '.join(f'{k}={v}' for k, v in extra.items())})" if extra else "")
        print(f"  {head}")
        for name, st in stats.items():
            if unit == "items/s":
                fig = f"{st['per_s']:>11,.0f} msg/s   (batch p50 {st['p50_ms']:8.1f} ms, n={st['n']})"
            elif unit == "ops/s":
                fig = (f"{st['per_s']:>11,.0f} ops/s   p50 {st['p50_ms']:7.3f} ms  p95 {st['p95_ms']:7.3f} ms"
                       f"  n={st['n']}")
            else:
                fig = f"p50 {st['p50_ms']:9.2f} ms  p95 {st['p95_ms']:9.2f} ms  n={st['n']}"
            ratio = ""
            if base and name != self.base and base["p50_ms"]:
                r_mean = st["mean_ms"] / base["mean_ms"]
                r_p50 = st["p50_ms"] / base["p50_ms"]
                ratio = f"   x{r_mean:5.2f} (mean)" if unit in ("ops/s", "items/s") else f"   x{r_p50:5.2f}"
            print(f"    {name:<{self.name_width}} {fig}{ratio:<16}{meter.fmt((probes or {}).get(name))}")

    def target(self, name: str, spec: str, value: float | None, passed: bool | None, detail: str = "",
               *, size: str = "", judged_at: tuple[str, ...] | None = None) -> None:
        """Record a SPEC §8 verdict. Measured at another size than SPEC names, it is only
        indicative and shown in lower case with a star; on PostgreSQL it is ``info``."""
        verdict = "n/a" if passed is None else ("PASS" if passed else "MISS")
        if not self.judged:
            verdict = "info"
        elif passed is not None and size and judged_at is not None and size not in judged_at:
            verdict = verdict.lower() + "*"
        self.targets.append({"target": name, "spec": spec, "value": value, "verdict": verdict, "detail": detail,
                             "size": size})

    def check(self, what: str, ok: bool, detail: str = "") -> None:
        if not ok:
            msg = f"MISMATCH {what}: {detail}"
            self.checks.append(msg)
            print(f"    !! {msg}")

    def fail(self, what: str, ok: bool, detail: str = "") -> None:
        """A correctness check that must hold (lost rows, wrong counters): the run exits 1."""
        if not ok:
            msg = f"FAILED {what}: {detail}"
            self.failures.append(msg)
            print(f"    !! {msg}")


# --------------------------------------------------------------------------- benchmarks

class Backend:
    """Where the data lives and what the floor is: a SQLite file or a PostgreSQL database.

    A *target* is what ``SessionDB`` opens: a file path (str) on SQLite, a
    ``postgresql+psycopg://`` URL on PostgreSQL. Private copies for write benchmarks
    are file copies or ``CREATE DATABASE … TEMPLATE`` clones; every database this run
    creates on the server is dropped at the end (unless ``keep``).
    """

    def __init__(self, name: str, server_url: str | None = None, keep: bool = False,
                 prepare_threshold: int | None = None, floor_prepared: bool = True) -> None:
        self.name = name
        #: PostgreSQL: psycopg's prepare_threshold for the library (None: our default, off).
        self.prepare_threshold = prepare_threshold
        #: PostgreSQL: whether the psycopg floor prepares (psycopg's default) or plans every call.
        self.floor_prepared = floor_prepared
        self.floor = "sqlite3" if name == "sqlite" else "psycopg"
        self.impls = ("facade", "repo", self.floor)
        self.server_url = server_url
        self.keep = keep
        self.created: list[str] = []
        self.ph = "?" if name == "sqlite" else "%s"

    @property
    def pg(self) -> bool:
        return self.name == "postgresql"

    def prepare(self, path: Path, label: str) -> str:
        """The target holding the generated corpus ``path`` (loaded into a new database on PG)."""
        if not self.pg:
            return str(path)
        assert self.server_url
        name = pg_load.new_name(label)
        url = pg_load.create_database(self.server_url, name)
        self.created.append(name)
        print(f"loading {path.name} into PostgreSQL database {name} ...")
        stats = pg_load.load(path, url, progress=print)
        print(f"  postgresql: {name} ready in {stats['seconds']:.1f}s, {stats['bytes'] / 2**20:,.0f} MiB")
        return self._library_url(url)

    def _library_url(self, url: str) -> str:
        """The URL the library opens: with ``?prepare_threshold=`` under ``--prepared``
        (the floors' conninfo drops it; they keep psycopg's own default of 5)."""
        if self.prepare_threshold is None:
            return url
        from sqlalchemy.engine import make_url

        return make_url(url).update_query_dict({"prepare_threshold": str(self.prepare_threshold)}).render_as_string(
            hide_password=False)

    def copy(self, target: str, kind: str) -> str:
        """A private copy of ``target`` for writers (never shared between implementations)."""
        if not self.pg:
            work = OUT / f"work-{kind}-{Path(target).stem}.db"
            self._remove_file(work)
            shutil.copyfile(target, work)
            return str(work)
        assert self.server_url
        from sqlalchemy.engine import make_url

        source = make_url(target).database
        name = pg_load.new_name(str(source).split("_")[1], kind)
        self.created.append(name)
        return self._library_url(pg_load.clone(self.server_url, str(source), name))

    def discard(self, target: str) -> None:
        if not self.pg:
            self._remove_file(Path(target))
            return
        from sqlalchemy.engine import make_url

        name = str(make_url(target).database)
        pg_load.drop_database(str(self.server_url), name)  # a private copy: never kept
        with contextlib.suppress(ValueError):
            self.created.remove(name)

    def drop_all(self) -> None:
        if self.pg and self.created and not self.keep:
            for name in list(self.created):
                with contextlib.suppress(Exception):
                    pg_load.drop_database(str(self.server_url), name)
            self.created.clear()
        elif self.created:
            print(f"kept PostgreSQL databases: {', '.join(self.created)} (drop: bench/pg_load.py --drop NAME...)")

    def floor_for(self, target: str) -> Any:
        if not self.pg:
            return Baseline(target)
        from pg_baseline import PgBaseline

        return PgBaseline(pg_load.conninfo(target), prepared=self.floor_prepared)

    def admin(self, target: str) -> Any:
        """An autocommit DB-API connection for setup statements (never timed)."""
        if not self.pg:
            return sqlite3.connect(target, isolation_level=None)
        import psycopg

        return psycopg.connect(pg_load.conninfo(target), autocommit=True)

    @staticmethod
    def _remove_file(path: Path) -> None:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(str(path) + suffix)


class Env:
    """One database opened three ways."""

    def __init__(self, bk: Backend, target: str) -> None:
        from hermes_store import SessionDB, UnitOfWork

        self.bk = bk
        self.target = target
        self.db = SessionDB(target)
        self.engine = self.db.engine
        self.UnitOfWork = UnitOfWork
        self.base = bk.floor_for(target)
        # Statement counters, attached only while meter.probe runs (facade and repo share the engine).
        lib = meter.EngineMeter(self.engine, held=lambda: meter.held_connections(self.db),
                                settle=lambda: self.db.wait_for_upkeep(60))
        self.meters: dict[str, meter.Meter] = {"facade": lib, "repo": lib, bk.floor: meter.floor_meter(self.base)}

    def uow(self, write: bool = False):  # type: ignore[no-untyped-def]
        return self.UnitOfWork(self.engine, write=write)

    def close(self) -> None:
        self.db.close()
        self.base.close()


class WriteEnv:
    """Three private copies of a database, one per implementation.

    Writers must not share a file: SQLite's checkpoints and FTS5's segment merges are
    paid by whichever connection happens to commit, so on a shared file one
    implementation would pay for another's writes. On PostgreSQL each gets its own
    database for the same reason (autovacuum, index page splits, GIN pending lists).
    """

    def __init__(self, bk: Backend, src: str) -> None:
        from hermes_store import SessionDB, UnitOfWork

        self.bk = bk
        self.targets = {name: bk.copy(src, name) for name in bk.impls}
        self.db = SessionDB(self.targets["facade"])
        self.repo_db = SessionDB(self.targets["repo"])  # its engine, PRAGMAs and pool; only UnitOfWork is timed
        self.UnitOfWork = UnitOfWork
        self.base = bk.floor_for(self.targets[bk.floor])
        self.admin = {n: bk.admin(t) for n, t in self.targets.items()}
        self.meters: dict[str, meter.Meter] = {
            "facade": meter.EngineMeter(self.db.engine, held=lambda: meter.held_connections(self.db),
                                        settle=lambda: self.db.wait_for_upkeep(60)),
            "repo": meter.EngineMeter(self.repo_db.engine, held=lambda: meter.held_connections(self.repo_db),
                                      settle=lambda: self.repo_db.wait_for_upkeep(60)),
            bk.floor: meter.floor_meter(self.base),
        }

    def uow(self):  # type: ignore[no-untyped-def]
        return self.UnitOfWork(self.repo_db.engine, write=True)

    def new_session(self, name: str, sid: str) -> None:
        ph = self.bk.ph
        self.admin[name].execute(f"INSERT INTO sessions (id, source, started_at) VALUES ({ph}, 'cli', {ph})",
                                 (sid, time.time()))

    def message_count(self, name: str, sid: str) -> int:
        return self.admin[name].execute(f"SELECT message_count FROM sessions WHERE id = {self.bk.ph}",
                                        (sid,)).fetchone()[0]

    def close(self) -> None:
        for c in self.admin.values():
            c.close()
        self.db.close()
        self.repo_db.close()
        self.base.close()
        for t in self.targets.values():
            self.bk.discard(t)


def bench_writes(rep: Report, bk: Backend, src: str, size: str, quick: bool, profile: bool) -> None:
    env = WriteEnv(bk, src)
    floor = bk.floor
    impls_order = bk.impls
    try:
        rounds, per_round = (3, 100) if quick else (6, 300)
        convs = generate.sample_messages(rounds * per_round, seed=4242)[0]
        for m in convs:  # callers hand tool_calls over as lists, as Hermes does
            if "tool_calls" in m:
                m["tool_calls"] = json.loads(m["tool_calls"])
        sid = "bench-append"
        for name in impls_order:
            env.new_session(name, sid)

        # ---- single appends: one transaction each, same message sequence for all
        pos = {n: 0 for n in impls_order}

        def next_msg(name: str) -> dict[str, Any]:
            m = convs[pos[name] % len(convs)]
            pos[name] += 1
            return m

        def f_facade() -> None:
            env.db.append_message(sid, **next_msg("facade"))

        def f_repo() -> None:
            m = next_msg("repo")
            with env.uow() as u:
                u.messages.append(sid, **m)

        def f_base() -> None:
            env.base.append_message(sid, **next_msg(floor))

        impls = {"facade": f_facade, "repo": f_repo, floor: f_base}
        samples: dict[str, list[int]] = {n: [] for n in impls_order}
        for _ in range(rounds):
            part = bench(impls, reps=per_round, warmup=3)
            for n in impls_order:
                samples[n] += part[n]
        # After the timed rounds: 100 calls for CPU, 50 counted (one cycle of the facade's
        # periodic checkpoint + index catch-up, every 50 writes).
        probes = {n: meter.probe(impls[n], env.meters[n], 100, 50) for n in impls_order}
        st = rep.add("single append (1 message / transaction)", size, samples, unit="ops/s", probes=probes)
        ratio = st["facade"]["mean_ms"] / st[floor]["mean_ms"]
        ratio50 = st["facade"]["p50_ms"] / st[floor]["p50_ms"]
        rep.target("single append", f"facade within 1.3x of {floor}", round(ratio, 2), ratio <= 1.3,
                   f"mean x{ratio:.2f}, p50 x{ratio50:.2f}; facade {st['facade']['per_s']:.0f}/s vs "
                   f"{floor} {st[floor]['per_s']:.0f}/s [{size}]", size=size)
        if profile:
            profile_call(f_facade, 300, OUT / f"profile-{bk.name}-single-append.txt")
        n_rows = {n: env.message_count(n, sid) for n in impls_order}
        rep.check("append counters", len(set(n_rows.values())) == 1, str(n_rows))
        if bk.pg:
            rep.notes.append(_single_floor_pg(env.base, convs, size))

        # ---- bulk append: one transaction of many messages over several sessions
        # A quick PostgreSQL run uses a smaller batch: every row there pays the server's
        # tsvector and GIN upkeep (hundreds of rows/s on a shared 2-core machine).
        batch_sessions, per_session = ((2, 250) if bk.pg else (4, 500)) if quick else (10, 500)
        bulk_rounds = 2 if quick else 3
        payload_src = generate.sample_messages(per_session, seed=777, sessions=batch_sessions)
        counter = {"n": 0}

        def make_batch(name: str) -> list[dict[str, Any]]:
            counter["n"] += 1
            items = []
            for j, conv in enumerate(payload_src):
                bsid = f"bulk-{counter['n']}-{j}"
                env.new_session(name, bsid)
                for m in conv:
                    d = dict(m, session_id=bsid)
                    if "tool_calls" in d:
                        d["tool_calls"] = json.loads(d["tool_calls"])
                    items.append(d)
            return items

        batch_len = batch_sessions * per_session

        def append_batch(name: str, items: list[dict[str, Any]]) -> None:
            """One bulk append of ``items`` by implementation ``name``."""
            if name == "facade":
                env.db.append_messages(items)
            elif name == "repo":
                with env.uow() as u:
                    u.messages.bulk_append(items)
            else:
                env.base.append_messages(items)

        samples = {n: [] for n in impls_order}
        for r in range(bulk_rounds + 1):  # first round is the warm-up
            order = list(impls_order[r % 3:] + impls_order[:r % 3])
            for name in order:
                items = make_batch(name)
                gc.collect()
                t = time.perf_counter_ns()
                append_batch(name, items)
                dt = time.perf_counter_ns() - t
                if r:
                    samples[name].append(dt)
        # After the timed rounds: more batches each (built first, so their session rows,
        # written through the admin connections, are neither counted nor in the CPU time).
        # SQLite: 2 for CPU + 1 counted; PostgreSQL: 1 doing both (a batch there takes seconds).
        def bulk_call(name: str, n: int) -> Callable[[], None]:
            batches = [make_batch(name) for _ in range(n)]

            def call() -> None:
                append_batch(name, batches.pop())
            return call

        cpu_calls = 1 if bk.pg else 2
        probes = {n: meter.probe(bulk_call(n, 1 if cpu_calls == 1 else cpu_calls + 1), env.meters[n], cpu_calls, 1)
                  for n in impls_order}
        maintained = "search indexes" if bk.pg else "FTS"
        st = rep.add(f"bulk append ({batch_len:,} messages / transaction, {maintained} maintained)", size, samples,
                     items=batch_len, unit="items/s", probes=probes)
        rate = st["facade"]["per_s"]
        rep.target("bulk append", ">= 20,000 messages/s, all indexes maintained", round(rate), rate >= 20_000,
                   f"facade {rate:,.0f}/s, repo {st['repo']['per_s']:,.0f}/s, {floor} floor "
                   f"{st[floor]['per_s']:,.0f}/s [{size}]", size=size)
        if profile:
            items = make_batch("facade")
            profile_call(lambda: env.db.append_messages(items), 1, OUT / f"profile-{bk.name}-bulk-append.txt")
        # What the floor costs without its search indexes (explains the bulk figure).
        if bk.pg:
            rep.notes.append(_bulk_floor_pg(env.base, payload_src, size))
        else:
            rep.notes.append(_bulk_floor_by_index(env.base, payload_src, size))
    finally:
        env.close()


def _bulk_floor_by_index(base: Baseline, payload_src: list[list[dict[str, Any]]], size: str) -> str:
    """sqlite3 bulk insert of the same batch with FTS triggers dropped, and with short texts.

    Runs inside a transaction that is rolled back, so the file is left as it was.
    """
    c = base.conn
    items = [dict(m, session_id=f"floor-{j}") for j, conv in enumerate(payload_src) for m in conv]
    short = [dict(m, content=(m.get("content") or "")[:100] or None) for m in items]
    c.execute("BEGIN IMMEDIATE")
    try:
        for j in range(len(payload_src)):
            c.execute("INSERT INTO sessions (id, source, started_at) VALUES (?, 'cli', 0)", (f"floor-{j}",))
        trig = [r[0] for r in c.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'messages_fts%'")]
        times = {}
        for label, batch, drop in (("no FTS triggers", items, trig),
                                   ("word index only", items, [t for t in trig if "trigram" in t]),
                                   ("all indexes, content cut to 100 chars", short, [])):
            c.execute("SAVEPOINT floor")
            for name in drop:
                c.execute(f"DROP TRIGGER {name}")
            rows = [base._row(m["session_id"], m, 1.0) for m in batch]
            t = time.perf_counter()
            c.executemany("INSERT INTO messages (session_id, role, content, tool_name, tool_calls, tool_call_id,"
                          " token_count, finish_reason, reasoning, timestamp) VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
            times[label] = len(batch) / (time.perf_counter() - t)
            c.execute("ROLLBACK TO floor")
            c.execute("RELEASE floor")
    finally:
        c.execute("ROLLBACK")
    msg = (f"bulk append floor (sqlite3 executemany of the same batch, before commit) [{size}]: "
           + ", ".join(f"{k}: {v:,.0f} msg/s" for k, v in times.items()))
    print(f"    {msg}")
    return msg


def _bulk_floor_pg(base: Any, payload_src: list[list[dict[str, Any]]], size: str) -> str:
    """psycopg bulk insert of the same batch without the search indexes, and with short texts.

    PostgreSQL's DDL is transactional: each variant drops what it leaves out inside a
    savepoint, inserts, and rolls back, so the database is left as it was.
    """
    import psycopg

    from pg_baseline import _INSERT

    c = base.conn
    items = [dict(m, session_id=f"floor-{j}") for j, conv in enumerate(payload_src) for m in conv]
    short = [dict(m, content=(m.get("content") or "")[:100] or None) for m in items]
    variants = (
        ("no search indexes (GIN word + trigram dropped)", items,
         ["DROP INDEX idx_messages_search_vector", "DROP INDEX idx_messages_trgm"]),
        ("no search at all (tsvector column dropped too)", items,
         ["DROP INDEX idx_messages_trgm", "ALTER TABLE messages DROP COLUMN search_vector"]),
        ("word index only", items, ["DROP INDEX idx_messages_trgm"]),
        ("all indexes, content cut to 100 chars", short, []),
    )
    times = {}
    with c.transaction():
        for j in range(len(payload_src)):
            c.execute("INSERT INTO sessions (id, source, started_at) VALUES (%s, 'cli', 0)", (f"floor-{j}",))
        for label, batch, ddl in variants:
            with c.transaction():
                for stmt in ddl:
                    c.execute(stmt)
                rows = [base._row(m["session_id"], m, 1.0) for m in batch]
                with c.cursor() as cur:
                    t = time.perf_counter()
                    cur.executemany(_INSERT, rows)
                    times[label] = len(batch) / (time.perf_counter() - t)
                raise psycopg.Rollback()
        raise psycopg.Rollback()
    msg = (f"bulk append floor (psycopg executemany of the same batch, before commit) [{size}]: "
           + ", ".join(f"{k}: {v:,.0f} msg/s" for k, v in times.items()))
    print(f"    {msg}")
    return msg


def _single_floor_pg(base: Any, convs: list[dict[str, Any]], size: str, n: int = 200) -> str:
    """What round trips cost a single append on PostgreSQL (floor variants, interleaved).

    ``transaction``: BEGIN, INSERT … RETURNING, UPDATE, COMMIT (the floor above, 4 round
    trips). ``one statement``: the INSERT and the counter UPDATE in one data-modifying
    CTE in autocommit (1 round trip, still one transaction).
    """
    from pg_baseline import _INSERT, _n_calls

    c = base.conn
    sid = "floor-single"
    c.execute("INSERT INTO sessions (id, source, started_at) VALUES (%s, 'cli', 0)", (sid,))
    one = ("WITH ins AS (" + _INSERT + " RETURNING id), up AS (UPDATE sessions SET message_count ="
           " COALESCE(message_count, 0) + 1, tool_call_count = COALESCE(tool_call_count, 0) + %s WHERE id = %s)"
           " SELECT id FROM ins")
    pos = {"k": 0}

    def msg() -> dict[str, Any]:
        pos["k"] += 1
        return convs[pos["k"] % len(convs)]

    def f_tx() -> None:
        base.append_message(sid, **msg())

    def f_one() -> None:
        m = msg()
        row = base._row(sid, m, time.time())
        c.execute(one, (*row, _n_calls(m.get("tool_calls")), sid)).fetchone()

    samples = bench({"transaction": f_tx, "one statement": f_one}, reps=n, warmup=5)
    st = {k: Stats.of(v) for k, v in samples.items()}
    msg_ = (f"single append floor variants (psycopg) [{size}]: "
            + ", ".join(f"{k}: p50 {v['p50_ms']:.3f} ms, {v['per_s']:,.0f}/s" for k, v in st.items()))
    print(f"    {msg_}")
    return msg_


def bench_search(rep: Report, env: Env, size: str, quick: bool, profile: bool) -> None:
    from hermes_store.search.query import plan_search

    reps, budget = (6, 1.0) if quick else (30, 4.0)
    groups = {
        "word search": [(q, "word") for q in WORD_QUERIES],
        "CJK 2-char search (substring scan)": [(q, "substring") for q in CJK2_QUERIES],
        "CJK 3+-char search (trigram index)": [(q, "trigram") for q in CJK3_QUERIES],
    }
    bk = env.bk
    floor_name = bk.floor
    impl_names = bk.impls
    if bk.pg:  # PostgreSQL answers every CJK query by substring (pg_trgm serves 3+ characters)
        groups["CJK 3+-char search (pg_trgm substring)"] = groups.pop("CJK 3+-char search (trigram index)")
    group_samples: dict[str, dict[str, list[int]]] = {}
    for group, queries in groups.items():
        print(f"  -- {group} [{size}] (each query: {' / '.join(impl_names)})")
        agg: dict[str, list[int]] = {n: [] for n in impl_names}
        agg_probes: dict[str, list[dict[str, Any]]] = {n: [] for n in impl_names}
        for q, kind in queries:
            plan = plan_search(q)
            if plan.kind != kind:
                rep.notes.append(f"query {q!r} routed to {plan.kind}, expected {kind}")
            if kind == "substring" or (kind == "trigram" and bk.pg):
                terms = list(plan.terms) if kind == "substring" else [q]
                base_fn = functools.partial(env.base.search_substring, terms)
                hits = env.base.count_substring(terms)
            else:
                index = "messages_fts" if kind == "word" else "messages_fts_trigram"
                match = q if kind == "word" else f'"{q}"'
                base_fn = functools.partial(env.base.search_fts, match, index=index)
                hits = env.base.count_matches(match, index)

            def repo_fn(q: str = q) -> Any:
                with env.uow() as u:
                    return u.search.search_messages(q)

            impls = {"facade": lambda q=q: env.db.search_messages(q), "repo": repo_fn, floor_name: base_fn}
            first: dict[str, Any] = {}
            probes: dict[str, dict[str, Any]] = {}
            samples = bench(impls, reps=reps, warmup=1, budget_s=budget, min_reps=5 if quick else 7, results=first,
                            meters=env.meters, probes=probes)
            ours, floor = first["facade"], first[floor_name]
            same = [h["id"] for h in ours] == [h["id"] for h in floor]
            if not same and kind != "substring":
                same = {h["id"] for h in ours} == {h["id"] for h in floor} or len(ours) == len(floor) == 20
            rep.check(f"search {q!r}", same, f"facade ids {[h['id'] for h in ours][:5]}... vs {floor_name} "
                                                f"{[h['id'] for h in floor][:5]}... ({len(ours)} vs {len(floor)} hits)")
            st = {n: Stats.of(s) for n, s in samples.items()}
            line = "   ".join(f"{n} {st[n]['p50_ms']:7.2f}/{st[n]['p95_ms']:7.2f}" for n in impl_names)
            print(f"    {q!r:<26} {hits:>7,} rows  p50/p95 ms: {line}   "
                  f"x{st['facade']['p50_ms'] / st[floor_name]['p50_ms']:.2f}")
            print(f"    {'':<26} {'':>7}       st, cpu ms/call: " + "   ".join(
                f"{n} {probes[n].get('stmts_per_call', 0):4.0f}, {probes[n]['client_cpu_ms_per_call']:7.3f}"
                for n in impl_names))
            for n in impl_names:
                agg[n] += samples[n]
                agg_probes[n].append(probes[n])
                rep.rows.append({"op": f"{group}: {q}", "size": size, "impl": n, "matching_rows": hits, **st[n],
                                 "unit": "ms", **probes[n]})
            if profile:
                slug = "".join(ch if ch.isalnum() else "_" for ch in q.encode("ascii", "backslashreplace").decode())
                profile_call(impls["facade"], 5, OUT / f"profile-{bk.name}-search-{kind}-{slug}.txt")
        group_samples[group] = agg
        rep.add(f"{group}, all queries", size, agg, probes={n: meter.merge(agg_probes[n]) for n in impl_names})
    word = Stats.of(group_samples["word search"]["facade"])
    rep.target("word search", "p50 < 20 ms on 200,000 messages", round(word["p50_ms"], 2), word["p50_ms"] < 20,
               f"facade p50 {word['p50_ms']:.2f} ms, p95 {word['p95_ms']:.2f} ms over {len(WORD_QUERIES)} queries"
               f" [{size}]", size=size, judged_at=("200k",))
    cjk = Stats.of(group_samples["CJK 2-char search (substring scan)"]["facade"])
    rep.target("CJK 2-char search", "p50 < 100 ms on 200,000 messages", round(cjk["p50_ms"], 2), cjk["p50_ms"] < 100,
               f"facade p50 {cjk['p50_ms']:.2f} ms, p95 {cjk['p95_ms']:.2f} ms over {len(CJK2_QUERIES)} queries"
               f" [{size}]", size=size, judged_at=("200k",))


def bench_lineage(rep: Report, env: Env, meta: dict[str, Any], size: str, quick: bool, profile: bool) -> None:
    root, tip = meta["deep_chain_root"], meta["deep_chain_tip"]
    reps = 10 if quick else 50

    def repo_anc() -> list[str]:
        with env.uow() as u:
            return u.lineage.ancestors(tip)

    fl = env.bk.floor
    impls = {"facade": lambda: env.db.get_session_lineage(tip), "repo": repo_anc,
             fl: lambda: env.base.ancestors(tip)}
    ours, floor = impls["facade"](), impls[fl]()
    rep.check("lineage chain", ours == floor and len(floor) == meta["deep_chain_length"],
              f"facade {len(ours)} ids, {fl} {len(floor)} ids")
    probes: dict[str, dict[str, Any]] = {}
    st = rep.add(f"lineage: tip -> root of a {meta['deep_chain_length']}-deep chain", size,
                 bench(impls, reps=reps, warmup=2, meters=env.meters, probes=probes), probes=probes)
    if profile:
        profile_call(impls["facade"], 20, OUT / f"profile-{env.bk.name}-lineage.txt")

    def repo_tip() -> str | None:
        with env.uow() as u:
            return u.lineage.compression_tip(root)

    impls2 = {"facade": lambda: env.db.get_compression_tip(root), "repo": repo_tip,
              fl: lambda: env.base.compression_tip(root)}
    rep.check("compression tip", impls2["facade"]() == impls2[fl]() == tip,
              f"{impls2['facade']()} vs {impls2[fl]()} (expected {tip})")
    probes2: dict[str, dict[str, Any]] = {}
    st2 = rep.add(f"compression tip: root -> tip of a {meta['deep_chain_length']}-deep chain", size,
                  bench(impls2, reps=reps, warmup=2, meters=env.meters, probes=probes2), probes=probes2)
    worst = max(st["facade"]["p50_ms"], st2["facade"]["p50_ms"])
    rep.target("1,000-deep lineage", "one query < 20 ms", round(worst, 2), worst < 20,
               f"tip->root p50 {st['facade']['p50_ms']:.2f} ms, root->tip p50 {st2['facade']['p50_ms']:.2f} ms"
               f" [{size}]", size=size)


def bench_listing(rep: Report, env: Env, meta: dict[str, Any], size: str, quick: bool, profile: bool) -> None:
    fl = env.bk.floor
    listed = meta.get("listed_sessions", 0)
    full_n = min(10_000, listed)
    results = {}
    cases = (("page of 20", 20, 10 if quick else 40), (f"all {full_n:,}", full_n, 3 if quick else 10))
    for label, limit, reps in cases:
        def repo_fn(limit: int = limit) -> Any:
            with env.uow() as u:
                return u.listing.list_rich(limit=limit)

        impls = {"facade": lambda limit=limit: env.db.list_sessions_rich(limit=limit), "repo": repo_fn,
                 fl: lambda limit=limit: env.base.list_sessions_rich(limit=limit)}
        first: dict[str, Any] = {}
        probes: dict[str, dict[str, Any]] = {}
        samples = bench(impls, reps=reps, warmup=1, budget_s=20.0, min_reps=3, results=first, meters=env.meters,
                        probes=probes)
        ours, floor = first["facade"], first[fl]
        ok = [(r["id"], r.get("_lineage_root_id"), r["preview"], r["last_active"]) for r in ours] == \
             [(r["id"], r.get("_lineage_root_id"), r["preview"], r["last_active"]) for r in floor]
        rep.check(f"listing {label}", ok, f"{len(ours)} vs {len(floor)} rows")
        results[label] = rep.add(f"list_sessions_rich: {label} (of {listed:,} visible, "
                                 f"{meta['sessions']:,} sessions)", size, samples, probes=probes)
        if profile:
            profile_call(impls["facade"], 3, OUT / f"profile-{env.bk.name}-listing-{limit}.txt")
    page = results["page of 20"]["facade"]["p50_ms"]
    full = results[f"all {full_n:,}"]["facade"]["p50_ms"]
    big = full_n >= 10_000
    note = "" if big else " (fewer than 10,000 visible sessions at this size)"
    rep.target("listing: page of 20", "of 10,000 sessions, with previews < 100 ms", round(page, 2),
               page < 100 if big else None,
               f"p50 {page:.2f} ms vs {fl} {results['page of 20'][fl]['p50_ms']:.2f} ms [{size}]{note}", size=size)
    rep.target(f"listing: all {full_n:,}", "10,000 sessions with previews < 100 ms", round(full, 2),
               full < 100 if big else None,
               f"p50 {full:.2f} ms vs {fl} {results[f'all {full_n:,}'][fl]['p50_ms']:.2f} ms [{size}]{note}", size=size)


def bench_replay(rep: Report, env: Env, meta: dict[str, Any], size: str, quick: bool, profile: bool) -> None:
    sid = meta["replay_session"]

    def repo_fn() -> Any:
        with env.uow() as u:
            return u.messages.conversation([sid])

    fl = env.bk.floor
    impls = {"facade": lambda: env.db.get_messages_as_conversation(sid), "repo": repo_fn,
             fl: lambda: env.base.conversation(sid)}
    ours, floor = impls["facade"](), impls[fl]()
    rep.check("replay", ours == floor, f"{len(ours)} vs {len(floor)} messages")
    probes: dict[str, dict[str, Any]] = {}
    rep.add(f"conversation replay ({meta['replay_messages']} messages)", size,
            bench(impls, reps=10 if quick else 40, warmup=2, meters=env.meters, probes=probes), probes=probes)
    if profile:
        profile_call(impls["facade"], 10, OUT / f"profile-{env.bk.name}-replay.txt")


# --------------------------------------------------------------------------- concurrent writers

def bench_writers(rep: Report, bk: Backend, src: str, size: str, quick: bool) -> None:
    """Aggregate append throughput and latency of 1, 4, 8 and 16 writer processes (bench/writers.py)."""
    per_writer = 150 if quick else 1000
    pool = generate.sample_messages(1000, seed=5151)[0]
    for m in pool:
        if "tool_calls" in m:
            m["tool_calls"] = json.loads(m["tool_calls"])
    impls = ("facade", bk.floor)
    where = "one WAL file" if not bk.pg else "one database"
    print(f"  -- concurrent writers [{size}] ({bk.name}, {where} per implementation; each writer a process with "
          f"{writers_mod.SESSIONS_PER_WRITER} sessions of its own, {per_writer} appends, 1 per transaction)")
    print(f"    {'writers':>7}  {'impl':<8} {'msg/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'cpu ms':>7} "
          f"{'st':>5}  {'rows lost':>9}  counters   ratio (floor/facade msg/s)")
    copies = {impl: bk.copy(src, f"c{impl}") for impl in impls}
    try:
        for r, k in enumerate(writers_mod.WRITER_COUNTS):
            res = {}
            for impl in (impls if r % 2 == 0 else impls[::-1]):
                res[impl] = writers_mod.run(impl, bk.name, copies[impl], f"k{k}", k, per_writer, pool)
            for impl in impls:
                x = res[impl]
                ratio = (f"x{res[bk.floor]['per_s'] / x['per_s']:.2f}" if impl == "facade" and x["per_s"]
                         else "")
                print(f"    {k:>7}  {impl:<8} {x['per_s']:>9,.0f} {x['p50_ms']:>8.2f} {x['p99_ms']:>8.2f} "
                      f"{x['max_ms']:>8.1f} {x['client_cpu_ms']:>7.2f} {x['stmts_per_append']:>5.1f}"
                      f"  {x['lost_rows']:>9}  "
                      f"{'exact' if x['counters_exact'] else 'WRONG':<9}  {ratio}")
                rep.rows.append({"op": f"concurrent writers x{k}", "size": size, "backend": bk.name,
                                 **{key: v for key, v in x.items() if key != "counter_mismatches"},
                                 "unit": "msg/s"})
                rep.fail(f"writers x{k} {impl}: rows lost", x["lost_rows"] == 0 and not x["errors"],
                          f"{x['lost_rows']} lost of {x['expected']}; errors: {x['errors'][:3]}")
                rep.fail(f"writers x{k} {impl}: counters", x["counters_exact"],
                          json.dumps(dict(list(x["counter_mismatches"].items())[:3])))
    finally:
        for t in copies.values():
            bk.discard(t)


# --------------------------------------------------------------------------- export (child processes)

def _rss_kib() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def export_worker(impl: str, path: str, checkpoint: int, trace: bool) -> dict[str, Any]:
    """Export the whole file as JSONL to /dev/null, sampling memory; runs in its own process."""
    import tracemalloc

    if trace:
        tracemalloc.start()
    env_db = None
    rss0 = _rss_kib()
    peak = rss0
    at_checkpoint: dict[str, Any] = {}
    sessions = messages = written = 0
    t0 = time.perf_counter()
    if impl == "facade":
        from hermes_store import SessionDB

        env_db = SessionDB(path)
        rows = env_db.iter_export()
        ctx: Any = contextlib.nullcontext()
    elif impl == "repo":
        from hermes_store import SessionDB, UnitOfWork

        env_db = SessionDB(path)
        ctx = UnitOfWork(env_db.engine, write=False)
        rows = None
    elif impl == "psycopg":
        from pg_baseline import PgBaseline

        base = PgBaseline(pg_load.conninfo(path))
        rows = base.iter_export()
        ctx = contextlib.nullcontext()
    else:
        base = Baseline(path)
        rows = base.iter_export()
        ctx = contextlib.nullcontext()
    rss0 = _rss_kib()
    peak = rss0
    if trace:
        tracemalloc.reset_peak()
    t0 = time.perf_counter()
    with ctx as uow, open(os.devnull, "w", encoding="utf-8") as fh:
        if rows is None:
            rows = uow.maintenance.iter_export()
        for row in rows:
            line = json.dumps(row, ensure_ascii=False, default=str)
            fh.write(line)
            fh.write("\n")
            written += len(line) + 1
            sessions += 1
            messages += len(row["messages"])
            if sessions % 20 == 0:
                peak = max(peak, _rss_kib())
            if not at_checkpoint and messages >= checkpoint:
                peak = max(peak, _rss_kib())
                at_checkpoint = {"messages": messages, "seconds": time.perf_counter() - t0,
                                 "rss_growth_mib": (peak - rss0) / 1024}
                if trace:
                    at_checkpoint["traced_peak_mib"] = tracemalloc.get_traced_memory()[1] / 2**20
    seconds = time.perf_counter() - t0
    peak = max(peak, _rss_kib())
    out = {"impl": impl, "seconds": seconds, "sessions": sessions, "messages": messages, "bytes": written,
           "rss_start_mib": rss0 / 1024, "rss_growth_mib": (peak - rss0) / 1024, "checkpoint": at_checkpoint}
    if trace:
        out["traced_peak_mib"] = tracemalloc.get_traced_memory()[1] / 2**20
    if env_db is not None:
        env_db.close()
    return out


def bench_export(rep: Report, bk: Backend, path: str, meta: dict[str, Any], size: str, quick: bool) -> None:
    fl = bk.floor
    total = meta["messages"]
    checkpoint = max(total // 10, 1)
    print(f"  -- export of {total:,} messages as JSON Lines (each run in a fresh process; memory checkpoint at "
          f"{checkpoint:,} messages)")
    results = {}
    runs = [(impl, False) for impl in bk.impls] + [("facade", True)]
    for impl, trace in runs:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--_export-worker", impl, str(path), str(checkpoint)]
        if trace:
            cmd.append("--_trace")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-3000:])
            raise SystemExit(f"export worker {impl} failed")
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        key = impl + (" +tracemalloc" if trace else "")
        results[key] = res
        cp = res["checkpoint"]
        traced = (f", traced peak {cp.get('traced_peak_mib', 0):.1f} -> {res['traced_peak_mib']:.1f} MiB"
                  if trace else "")
        print(f"    {key:<20} {res['seconds']:7.1f} s  {res['messages'] / res['seconds']:>9,.0f} msg/s  "
              f"{res['bytes'] / 2**20:8.1f} MiB JSONL   RSS growth {cp.get('rss_growth_mib', 0):6.1f} MiB at "
              f"{cp.get('messages', 0):,} msgs -> {res['rss_growth_mib']:6.1f} MiB at {res['messages']:,}{traced}")
        rep.rows.append({"op": "export JSONL", "size": size, "impl": key, **res, "unit": "s",
                         "per_s": res["messages"] / res["seconds"]})
    f, b = results["facade"], results[fl]
    print(f"    facade/{fl} time ratio x{f['seconds'] / b['seconds']:.2f}")
    rep.check("export", (f["sessions"], f["messages"], f["bytes"]) == (b["sessions"], b["messages"], b["bytes"]),
              f"facade {f['sessions']:,} sessions / {f['messages']:,} messages / {f['bytes']:,} bytes vs {fl} "
              f"{b['sessions']:,} / {b['messages']:,} / {b['bytes']:,}")
    growth_cp = f["checkpoint"].get("rss_growth_mib", 0.0)
    growth_end = f["rss_growth_mib"]
    t = results["facade +tracemalloc"]
    traced_cp, traced_end = t["checkpoint"].get("traced_peak_mib", 0.0), t["traced_peak_mib"]
    # Flat: the whole run needs no more memory than its first tenth (+ a small allowance).
    flat = growth_end <= growth_cp * 1.5 + 16 and traced_end <= traced_cp * 1.5 + 8
    rep.target(f"export {total:,} messages", "flat memory (streamed)", round(growth_end, 1),
               flat,
               f"RSS growth {growth_cp:.1f} MiB at {f['checkpoint'].get('messages', 0):,} msgs vs {growth_end:.1f} MiB"
               f" at {f['messages']:,}; Python heap peak {traced_cp:.1f} vs {traced_end:.1f} MiB; "
               f"{f['messages'] / f['seconds']:,.0f} msg/s ({fl} {b['messages'] / b['seconds']:,.0f}/s) [{size}]",
               size=size, judged_at=("1M",))


# --------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10k messages, few repetitions, no 1M (1-2 minutes)")
    ap.add_argument("--sizes", nargs="+", help="database sizes, e.g. 10k 200k 1M (default: 200k 1M; quick: 10k)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", nargs="+", choices=GROUPS + OPT_IN_GROUPS, help="run only these groups")
    ap.add_argument("--async", dest="run_async", action="store_true",
                    help="also run the async group: hermes_store.aio.AsyncSessionDB against the sync SessionDB and "
                         "the plain floors (sqlite3 and aiosqlite; raw asyncpg and psycopg): single append, search, "
                         "listing, 8 concurrent tasks (bench/aio_bench.py); --only async runs it alone")
    ap.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite",
                    help="sqlite (a file; floor: sqlite3) or postgresql (a server; floor: psycopg)")
    ap.add_argument("--url", default=pg_load.default_url(),
                    help="PostgreSQL server, postgresql+psycopg://... (default $HERMES_STORE_TEST_PG_URL); "
                         "each run creates its own databases there and drops them at the end")
    ap.add_argument("--pg-keep", action="store_true", help="keep the loaded PostgreSQL databases (names printed)")
    ap.add_argument("--prepared", action="store_true",
                    help="PostgreSQL: let psycopg prepare statements on the server (prepare_threshold=5), as on a "
                         "direct connection or a pooler that tracks them; the default is off (safe behind any pooler)")
    ap.add_argument("--floor-unprepared", action="store_true",
                    help="PostgreSQL: the psycopg floor plans every statement (prepare_threshold=None), as the "
                         "library does by default; the default floor is psycopg's own (prepared after 5 executions)")
    ap.add_argument("--profile", action="store_true", help="write cProfile reports of the facade to bench/out/")
    ap.add_argument("--explain", action="store_true",
                    help="PostgreSQL: record the facade's statements for one call per search route, lineage and "
                         "listing, and write their EXPLAIN (ANALYZE, BUFFERS) plans to bench/plans-postgresql.md; "
                         "runs no timed group unless --only names some")
    ap.add_argument("--cjk-sessions", type=float, default=None, metavar="PCT",
                    help="corpus with PCT %% of its sessions Chinese/Japanese/Korean (default: the standard mix, "
                         "30 %%: about 20 %% CJK rows at 200k, 15 %% at 10k; 40 gives about 20 %% at 10k); a separate "
                         "cached file")
    ap.add_argument("--json", default=None,
                    help="results file (default bench/out/results[-quick][-postgresql].json)")
    ap.add_argument("--_export-worker", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--_trace", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args._export_worker:
        impl, path, checkpoint = args._export_worker
        print(json.dumps(export_worker(impl, path, int(checkpoint), args._trace)))
        return 0

    pg = args.backend == "postgresql"
    if args.explain and not pg:
        ap.error("--explain needs --backend postgresql")
    if pg and not args.url:
        ap.error("--backend postgresql needs a server: --url postgresql+psycopg://... or HERMES_STORE_TEST_PG_URL")
    bk = Backend(args.backend, args.url if pg else None, keep=args.pg_keep,
                 prepare_threshold=5 if args.prepared else None, floor_prepared=not args.floor_unprepared)
    t_start = time.perf_counter()
    sizes = [generate.parse_size(s) for s in (args.sizes or (["10k"] if args.quick else ["200k", "1M"]))]
    sizes = sorted(set(sizes))
    groups = set(args.only or (() if args.explain else GROUPS))
    if args.run_async:
        groups.add("async")
    info = machine_info(args.url if pg else None)
    info["backend"] = bk.name
    print("hermes_store benchmark" + (" (quick)" if args.quick else "") + f" -- backend {bk.name}, floor {bk.floor}")
    print(f"  CPU       {info['cpu']} x {info['cores']} logical cores, {info['memory_gib']} GiB RAM")
    print(f"  platform  {info['platform']}   load average (1 min) at start: {info['loadavg_1m']}")
    print(f"  versions  Python {info['python']}, SQLite {info['sqlite']}, SQLAlchemy {info['sqlalchemy']}, "
          f"hermes_store {info['hermes_store']} @ {info['commit']}")
    if pg:
        settings = ", ".join(f"{k}={v}" for k, v in sorted(info["postgresql_settings"].items()))
        from sqlalchemy.engine import make_url

        server = make_url(args.url)
        print(f"  server    PostgreSQL {info['postgresql']} (psycopg {info['psycopg']}) at "
              f"{server.host}:{server.port}; {settings}")
        library = "prepared after 5 executions (--prepared)" if args.prepared else "not prepared (its default)"
        floor = ("plans every call (--floor-unprepared)" if args.floor_unprepared
                 else "psycopg's default: prepared after 5 executions")
        print(f"  prepares  library statements {library}; psycopg floor {floor}")
    print()

    dbs = {}
    targets: dict[int, str] = {}
    rep = Report(base=bk.floor, judged=not pg)
    try:
        for n in sizes:
            path, meta = generate.ensure_db(n, args.seed, progress=print, cjk_sessions=args.cjk_sessions)
            dbs[n] = (path, meta)
            print(f"db {generate.label(n)}: {path.name}  {meta['messages']:,} messages, {meta['sessions']:,} sessions "
                  f"({meta['listed_sessions']:,} visible in listings), {meta['bytes'] / 2**20:,.0f} MiB")
        core_sizes = [n for n in sizes if n <= 200_000] or [min(sizes)]
        export_size = max(sizes)
        for n in sizes:
            if n in core_sizes or ("export" in groups and n == export_size):
                targets[n] = bk.prepare(dbs[n][0], generate.label(n) + (
                    f"cjk{args.cjk_sessions:g}".replace(".", "") if args.cjk_sessions is not None else ""))
        print()

        if args.explain:
            import explain

            n = core_sizes[0]
            print(f"== EXPLAIN (ANALYZE, BUFFERS) of the facade's statements on {generate.label(n)} messages ==")
            env = Env(bk, targets[n])
            try:
                written = explain.run(env, dbs[n][1], generate.label(n), dbs[n][0], info)
            finally:
                env.close()
            print(f"  plans written to {written}")
            print()

        for n in core_sizes:
            meta = dbs[n][1]
            target = targets[n]
            size = generate.label(n)
            print(f"== core operations on {size} messages ({bk.name}) ==")
            if "writes" in groups:
                bench_writes(rep, bk, target, size, args.quick, args.profile)
            if groups & {"search", "lineage", "listing", "replay"}:
                env = Env(bk, target)
                try:
                    if "search" in groups:
                        bench_search(rep, env, size, args.quick, args.profile)
                    if "lineage" in groups:
                        bench_lineage(rep, env, meta, size, args.quick, args.profile)
                    if "listing" in groups:
                        bench_listing(rep, env, meta, size, args.quick, args.profile)
                    if "replay" in groups:
                        bench_replay(rep, env, meta, size, args.quick, args.profile)
                finally:
                    env.close()
            if "writers" in groups:
                bench_writers(rep, bk, target, size, args.quick)
            if "async" in groups:
                import aio_bench

                aio_bench.run_group(rep, bk, target, meta, size, args.quick, Stats)
            print()
        if "export" in groups:
            meta = dbs[export_size][1]
            print(f"== export on {generate.label(export_size)} messages ({bk.name}) ==")
            bench_export(rep, bk, targets[export_size], meta, generate.label(export_size), args.quick)
            print()
    finally:
        bk.drop_all()

    # A target is judged where SPEC §8 defines it (200k); at other sizes it is shown for information.
    if pg:
        print("== SPEC §8 targets (SQLite targets: on PostgreSQL shown for information, never judged) ==")
    else:
        print("== SPEC §8 targets ==")
    for t in rep.targets:
        print(f"  {t['verdict']:<5} {t['target']:<22} {t['spec']:<46} {t['detail']}")
    if any(t["verdict"].endswith("*") for t in rep.targets):
        print("  * measured at another size than SPEC §8 names (200k; 1M for export): indicative only")
    if rep.notes:
        print("\nnotes:")
        for note in rep.notes:
            print(f"  - {note}")
    if rep.failures:
        print("\nFAILED checks (rows lost or counters wrong under concurrent writers):")
        for c in rep.failures:
            print(f"  - {c}")
    if rep.checks:
        print(f"\nresult mismatches between facade and {bk.floor} (the figures above may not compare like with like):")
        for c in rep.checks:
            print(f"  - {c}")
    elapsed = time.perf_counter() - t_start
    with contextlib.suppress(OSError):
        info["loadavg_1m_end"] = os.getloadavg()[0]
        print(f"load average (1 min) at end: {info['loadavg_1m_end']:.2f} on {info['cores']} cores"
              + ("  -- other work was running: expect noisy figures" if info["loadavg_1m_end"] > 1.5 else ""))
    print(f"\ntotal time {elapsed:.1f} s")
    suffixes = [("-quick", args.quick), ("-postgresql", pg), ("-prepared", args.prepared),
                ("-floor-unprepared", args.floor_unprepared), ("-async", "async" in groups)]
    default_name = "results" + "".join(s for s, on in suffixes if on) + ".json"
    out = Path(args.json) if args.json else OUT / default_name
    if not groups:
        print("no timed groups ran: no results file written")
        return 1 if rep.failures else 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": info, "backend": bk.name, "quick": args.quick, "seed": args.seed,
                               "databases": {generate.label(n): m for n, (_p, m) in dbs.items()},
                               "results": rep.rows, "targets": rep.targets, "notes": rep.notes,
                               "failures": rep.failures, "mismatches": rep.checks, "seconds": elapsed},
                              indent=1, ensure_ascii=False, default=str))
    print(f"results written to {out}")
    return 1 if rep.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
