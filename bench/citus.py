"""Citus: the same workload on a plain schema and on a distributed schema, same coordinator, same run.

    source /tmp/citusenv.sh; source /tmp/pgenv.sh   # or scripts/citus-test-cluster / pg-test-server
    .venv/bin/python bench/citus.py --quick          # 10k messages, few repetitions (1.5-2 minutes)
    .venv/bin/python bench/citus.py                  # the same corpus, more repetitions
    .venv/bin/python bench/citus.py --no-pg          # without the separate plain PostgreSQL server
    .venv/bin/python bench/citus.py --size 200k      # a larger corpus (loading takes minutes)
    .venv/bin/python bench/citus.py --quick --floor-unprepared   # the floor plans every call, as the library

Issue 33 asks what a tenant pays for living in a Citus *distributed schema*
(schema-based sharding: a schema created while ``citus.enable_schema_based_sharding``
is on becomes one single-shard colocation group placed whole on a worker). The run
loads ``generate.py``'s seeded corpus (with ``hermes_store.copying.copy_history``, the
library's own copy, which migrates the tenant to head first) into:

* ``plain``: a schema of the Citus coordinator created with schema-based sharding off:
  ordinary local tables, the coordinator answers alone;
* ``dist``:  a schema created with it on: every statement is planned by Citus on the
  coordinator and executed on the worker holding the schema (coordinator -> worker hop);
* ``pg`` (optional, ``--pg-url``, default ``$HERMES_STORE_TEST_PG_URL``): a schema on a
  separate plain PostgreSQL server, for reference (another server: other settings,
  no Citus planner hook at all).

``plain`` and ``dist`` are the same server and binaries, so only distribution differs.
Each target is then opened twice, as ``SessionDB(url?schema=NAME)`` (the facade) and as
``pg_baseline.PgBaseline``, the plain psycopg floor of ``run.py --backend postgresql``
(its connection's ``search_path`` set to the schema): the floor shows what the hop costs
a hand-written client, so the facade's ratio can be read against it. Operations, reads
first (appends add a listed session): a point read of one session row, word search,
CJK 2-character and 3+-character search, ``list_sessions_rich`` (a page of 20 and every
visible session), lineage (``get_session_lineage`` of the 1,000-deep chain's tip,
``get_compression_tip`` of its root), and single appends (one message per transaction,
p50/p95 and throughput). Every call of every target and side is interleaved round-robin
in one schedule (``timing.Schedule`` through ``run.bench``), so drift hits all alike;
``rt`` is round trips per call (``meter.py``) and ``+ms/rt`` the distributed schema's
extra latency per round trip. Results must be the same on every target (checked).

On a Citus server the library opens each write transaction with ``SET LOCAL`` s that
Citus propagates to the worker (``dialects.pg_citus.lock_budget``: a lock budget must bind
where the locks are taken), on the coordinator's plain schemas as well: a facade append
there is 3 round trips, against 1 on plain PostgreSQL (the ``pg`` figures).

All nodes of the test cluster run on this machine: the hop is loopback, so its cost
here is Citus' planning and executor work plus a local socket, a floor for a real
network. Results go to ``bench/out/citus-results[-quick].json``; every schema the run
created is dropped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterable

# Run as a file, this folder is first on sys.path; importing run.py puts the repository
# there too (as every script here does), so hermes_store is found without an install.
import generate
import meter
import pg_load
from pg_baseline import PgBaseline
from run import CJK2_QUERIES, CJK3_QUERIES, WORD_QUERIES, Report, Stats, bench, machine_info

import psycopg
from sqlalchemy.engine import make_url

from hermes_store import SessionDB
from hermes_store.copying import copy_history
from hermes_store.engine import with_schema
from hermes_store.search.query import plan_search

OUT = generate.OUT
SIDES = ("facade", "floor")
SIDE_LABEL = {"facade": "SessionDB", "floor": "psycopg floor"}
#: Session ids the appends write to (new sessions, one per side, on every target).
APPEND_SID = {"facade": "hb-citus-append-facade", "floor": "hb-citus-append-floor"}

Fn = Callable[[], Any]


def admin(url: str) -> psycopg.Connection[Any]:
    """An autocommit psycopg connection to the server of ``url`` (setup, never timed)."""
    return psycopg.connect(pg_load.conninfo(url), autocommit=True)


def floor_conninfo(server_url: str, schema: str) -> str:
    """The floor's libpq URI: the server of ``server_url`` with ``search_path`` set to ``schema``
    (the floor's SQL names tables unqualified, as a hand-written client of one tenant would)."""
    url = make_url(server_url).difference_update_query(["schema"]).update_query_dict(
        {"options": f"-csearch_path={schema}"})
    return pg_load.conninfo(url.render_as_string(hide_password=False))


class Tenant:
    """One target: a schema on a server, loaded with the corpus, opened as facade and floor."""

    def __init__(self, key: str, server_url: str, distributed: bool, floor_prepared: bool = True) -> None:
        self.key = key
        self.floor_prepared = floor_prepared
        self.server_url = server_url
        self.distributed = distributed
        self.schema = f"hb_citus_{key}_{uuid.uuid4().hex[:8]}"
        self.url = with_schema(server_url, self.schema)
        self.created = False
        self.db: SessionDB | None = None
        self.base: PgBaseline | None = None
        self.meters: dict[str, meter.Meter] = {}
        self.load_s = 0.0

    def create(self) -> None:
        """CREATE SCHEMA, distributed when schema-based sharding is on for that statement
        (set on this admin session only, as the tests' ``citus_tenant`` fixture does)."""
        with admin(self.server_url) as conn:
            if self.distributed:
                conn.execute("SET citus.enable_schema_based_sharding TO on")
            conn.execute(f'CREATE SCHEMA "{self.schema}"')
        self.created = True

    def load(self, corpus: Path) -> None:
        """The corpus through the library's copy (migrates the tenant to head, builds the
        short-CJK index, verifies), then ``VACUUM ANALYZE`` as autovacuum would leave it."""
        t = time.perf_counter()
        copy_history(corpus, self.url)
        with admin(self.server_url) as conn:
            tables = [r[0] for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (self.schema,)).fetchall()]
            for table in tables:
                conn.execute(f'VACUUM ANALYZE "{self.schema}"."{table}"')
        self.load_s = time.perf_counter() - t

    def placement(self) -> str:
        """Where the tenant's tables live, as Citus reports it (so the header proves the setup)."""
        with admin(self.server_url) as conn:
            if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'citus'").fetchone() is None:
                return "plain PostgreSQL server (no Citus)"
            row = conn.execute(
                "SELECT count(DISTINCT table_name), string_agg(DISTINCT nodename || ':' || nodeport, ', ')"
                " FROM citus_shards WHERE table_name::text LIKE %s", (f"{self.schema}.%",)).fetchone()
        assert row is not None
        if not row[0]:
            return "local tables on the coordinator (none in citus_shards)"
        return f"{row[0]} single-shard tables, all on worker {row[1]}"

    def open(self) -> None:
        db = self.db = SessionDB(self.url)
        base = self.base = PgBaseline(floor_conninfo(self.server_url, self.schema), prepared=self.floor_prepared)
        self.meters = {"facade": meter.EngineMeter(db.engine, held=lambda: meter.held_connections(db),
                                                   settle=lambda: db.wait_for_upkeep(60)),
                       "floor": meter.floor_meter(base)}
        db.create_session(APPEND_SID["facade"], "cli")
        base.conn.execute("INSERT INTO sessions (id, source, started_at) VALUES (%s, 'cli', %s)",
                          (APPEND_SID["floor"], time.time()))

    @property
    def facade(self) -> SessionDB:
        assert self.db is not None
        return self.db

    @property
    def floor(self) -> PgBaseline:
        assert self.base is not None
        return self.base

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
        if self.base is not None:
            self.base.close()

    def drop(self) -> None:
        if self.created:
            with admin(self.server_url) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


class Feed:
    """The same message sequence for every implementation, each at its own position."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = messages
        self.pos: dict[str, int] = {}

    def next(self, name: str) -> dict[str, Any]:
        i = self.pos.get(name, 0)
        self.pos[name] = i + 1
        return self.messages[i % len(self.messages)]


class Run:
    """The targets, the per-operation figures (detailed lines through ``run.Report``) and the summary."""

    def __init__(self, tenants: list[Tenant], size: str, quick: bool) -> None:
        self.tenants = tenants
        self.size = size
        self.quick = quick
        self.rep = Report(base="plain", judged=False)
        self.summary: list[tuple[str, dict[str, dict[str, Stats]], dict[str, dict[str, dict[str, Any]]]]] = []

    def time(self, calls: Callable[[Tenant], tuple[Fn, Fn]], *, reps: int, warmup: int = 1,
             budget_s: float | None = None, min_reps: int = 5
             ) -> tuple[dict[str, list[int]], dict[str, Any], dict[str, dict[str, Any]]]:
        """Every target's facade and floor call, interleaved in one schedule, then probed
        (round trips and client CPU per call). Keys: ``"<target> <side>"``."""
        impls: dict[str, Fn] = {}
        meters: dict[str, meter.Meter] = {}
        for t in self.tenants:
            for side, fn in zip(SIDES, calls(t), strict=True):
                impls[f"{t.key} {side}"] = fn
                meters[f"{t.key} {side}"] = t.meters[side]
        first: dict[str, Any] = {}
        probes: dict[str, dict[str, Any]] = {}
        samples = bench(impls, reps=reps, warmup=warmup, budget_s=budget_s, min_reps=min_reps, results=first,
                        meters=meters, probes=probes)
        return samples, first, probes

    def record(self, op: str, samples: dict[str, list[int]], probes: dict[str, dict[str, Any]],
               unit: str = "ms") -> None:
        """Print the operation's lines (ratios against ``plain``) and keep it for the summary."""
        stats: dict[str, dict[str, Stats]] = {}
        side_probes: dict[str, dict[str, dict[str, Any]]] = {}
        for side in SIDES:
            s = {t.key: samples[f"{t.key} {side}"] for t in self.tenants}
            side_probes[side] = {t.key: probes.get(f"{t.key} {side}", {}) for t in self.tenants}
            stats[side] = self.rep.add(f"{op} -- {SIDE_LABEL[side]}", self.size, s, unit=unit,
                                       probes=side_probes[side])
        self.summary.append((op, stats, side_probes))

    def same(self, what: str, first: dict[str, Any], key: Callable[[Any], Any] = lambda v: v) -> None:
        """Every target returned the same (per side): the timings compare like with like."""
        for side in SIDES:
            got = {t.key: key(first[f"{t.key} {side}"]) for t in self.tenants}
            ref = got[self.tenants[0].key]
            self.rep.check(f"{what} ({SIDE_LABEL[side]})", all(v == ref for v in got.values()),
                           ", ".join(f"{k}: {str(v)[:60]}" for k, v in got.items()))

    # ------------------------------------------------------------------ operations

    def point_read(self, sid: str) -> None:
        """One session row by key: the smallest read, so the hop is most of it."""
        def calls(t: Tenant) -> tuple[Fn, Fn]:
            return (lambda: t.facade.get_session(sid),
                    lambda: t.floor.conn.execute("SELECT * FROM sessions WHERE id = %s", (sid,)).fetchone())

        samples, first, probes = self.time(calls, reps=60 if self.quick else 300, warmup=3)
        self.same("point read", first, key=lambda v: v["id"] if isinstance(v, dict) else v[0])
        self.record("point read (get_session)", samples, probes)

    def search(self, group: str, queries: Iterable[str]) -> None:
        """A group of queries, one schedule each, pooled into the group's line."""
        reps, budget = (6, 0.6) if self.quick else (30, 4.0)
        pooled: dict[str, list[int]] = {}
        pooled_probes: dict[str, list[dict[str, Any]]] = {}
        print(f"  -- {group} [{self.size}] (per query, p50 ms facade / floor)")
        for q in queries:
            routed = floor_search(q)

            def calls(t: Tenant, q: str = q, floor_fn: Callable[[PgBaseline], Any] = routed) -> tuple[Fn, Fn]:
                return (lambda: t.facade.search_messages(q)), (lambda: floor_fn(t.floor))

            samples, first, probes = self.time(calls, reps=reps, budget_s=budget)
            self.same(f"search {q!r}", first, key=lambda hits: sorted(h["id"] for h in hits))
            for name, s in samples.items():
                pooled.setdefault(name, []).extend(s)
                pooled_probes.setdefault(name, []).append(probes[name])
            p50 = {n: Stats.of(s)["p50_ms"] for n, s in samples.items()}
            line = "   ".join(f"{t.key} {p50[f'{t.key} facade']:6.2f} / {p50[f'{t.key} floor']:6.2f}"
                              for t in self.tenants)
            print(f"    {q!r:<26} {len(first[f'{self.tenants[0].key} facade']):>3} hits   {line}")
        self.record(f"{group}, all queries", pooled, {n: meter.merge(p) for n, p in pooled_probes.items()})

    def listing(self, limit: int, label: str) -> None:
        def calls(t: Tenant) -> tuple[Fn, Fn]:
            return (lambda: t.facade.list_sessions_rich(limit=limit),
                    lambda: t.floor.list_sessions_rich(limit=limit))

        reps = (10, 5) if self.quick else (40, 15)
        samples, first, probes = self.time(calls, reps=reps[limit > 20], budget_s=10.0, min_reps=3)
        self.same(f"listing {label}", first, key=lambda rows: [(r["id"], r["preview"]) for r in rows])
        self.record(f"list_sessions_rich: {label}", samples, probes)

    def lineage(self, root: str, tip: str, depth: int) -> None:
        reps = 10 if self.quick else 50

        def ancestors(t: Tenant) -> tuple[Fn, Fn]:
            return (lambda: t.facade.get_session_lineage(tip)), (lambda: t.floor.ancestors(tip))

        def compression_tip(t: Tenant) -> tuple[Fn, Fn]:
            return (lambda: t.facade.get_compression_tip(root)), (lambda: t.floor.compression_tip(root))

        for op, calls in ((f"lineage: tip -> root, {depth} deep", ancestors),
                          (f"compression tip: root -> tip, {depth} deep", compression_tip)):
            samples, first, probes = self.time(calls, reps=reps, warmup=2)
            self.same(op, first)
            self.record(op, samples, probes)

    def appends(self) -> None:
        """Single appends, one message per transaction, the same sequence on every target and side."""
        n = 300 if self.quick else 1000
        messages = generate.sample_messages(n, seed=4242)[0]
        for m in messages:  # callers hand tool_calls over as lists, as Hermes does
            if "tool_calls" in m:
                m["tool_calls"] = json.loads(m["tool_calls"])
        feed = Feed(messages)

        def calls(t: Tenant) -> tuple[Fn, Fn]:
            return (lambda: t.facade.append_message(APPEND_SID["facade"], **feed.next(f"{t.key} facade")),
                    lambda: t.floor.append_message(APPEND_SID["floor"], **feed.next(f"{t.key} floor")))

        samples, _first, probes = self.time(calls, reps=n, warmup=3)
        self.record("single append (1 message / transaction)", samples, probes, unit="ops/s")
        counts = {t.key: t.floor.conn.execute("SELECT id, message_count FROM sessions WHERE id = ANY(%s) ORDER BY id",
                                              (list(APPEND_SID.values()),)).fetchall() for t in self.tenants}
        ref = counts[self.tenants[0].key]
        self.rep.check("append counters", all(c == ref for c in counts.values()), str(counts))

    # ------------------------------------------------------------------ summary

    def print_summary(self) -> None:
        """One line per operation: p50 on plain and dist, their ratio, round trips and the
        extra ms per round trip, for the facade and the floor; then the other server's p50."""
        keys = [t.key for t in self.tenants]
        extra = [k for k in keys if k not in ("plain", "dist")]
        print("== summary: p50 ms; dist/plain = distributed schema over plain schema of the same coordinator;")
        print("   rt = round trips per call (on dist); +ms/rt = (dist - plain) / rt ==")
        cols = f"{'plain':>7} {'dist':>7} {'dist/plain':>10} {'rt':>4} {'+ms/rt':>7}"
        width = len(cols)
        print(f"  {'':<40}" + "".join(f" | {SIDE_LABEL[side]:<{width}}" for side in SIDES)
              + "".join(f" | {k + ' server':<15}" for k in extra))
        print(f"  {'operation':<40}" + f" | {cols}" * len(SIDES) + f" | {'facade':>7} {'floor':>7}" * len(extra))
        for op, stats, probes in self.summary:
            line = f"  {op[:40]:<40}"
            for side in SIDES:
                plain, dist = stats[side]["plain"]["p50_ms"], stats[side]["dist"]["p50_ms"]
                rt = float(probes[side]["dist"].get("stmts_per_call") or 0)
                per_rt = f"{(dist - plain) / rt:7.3f}" if rt else f"{'':>7}"
                ratio = f"x{dist / plain:.2f}"
                line += f" | {plain:7.2f} {dist:7.2f} {ratio:>10} {rt:4.1f} {per_rt}"
            for k in extra:
                line += f" | {stats['facade'][k]['p50_ms']:7.2f} {stats['floor'][k]['p50_ms']:7.2f}"
            print(line)
        appends = next((s for op, s, _p in self.summary if op.startswith("single append")), None)
        if appends:
            print("  single append, ops/s from the mean (p95 ms): " + "; ".join(
                f"{SIDE_LABEL[side]} " + ", ".join(
                    f"{k} {appends[side][k]['per_s']:,.0f} ({appends[side][k]['p95_ms']:.2f})" for k in keys)
                for side in SIDES))


def floor_search(q: str) -> Callable[[PgBaseline], Any]:
    """The floor's search for ``q`` (routed once, outside the timed calls): a word query on
    ``search_vector``, CJK by substring (``pg_trgm`` serves 3+ characters), as in run.py."""
    plan = plan_search(q)
    if plan.kind == "word":
        return lambda base: base.search_fts(q)
    terms = list(plan.terms) if plan.kind == "substring" else [q]
    return lambda base: base.search_substring(terms)


def run_workload(r: Run, meta: dict[str, Any]) -> None:
    """Reads first (appends add a listed session), then appends."""
    r.point_read(meta["replay_session"])
    r.search("word search", WORD_QUERIES)
    r.search("CJK 2-char search", CJK2_QUERIES)
    r.search("CJK 3+-char search", CJK3_QUERIES)
    listed = min(10_000, int(meta.get("listed_sessions", 0)))
    r.listing(20, "page of 20")
    r.listing(listed, f"all {listed:,} visible")
    r.lineage(meta["deep_chain_root"], meta["deep_chain_tip"], int(meta["deep_chain_length"]))
    r.appends()


def citus_info(url: str) -> str:
    """Citus' version and nodes, for the header."""
    with admin(url) as conn:
        version = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'citus'").fetchone()
        nodes = conn.execute("SELECT nodename || ':' || nodeport, groupid FROM pg_dist_node"
                             " WHERE noderole = 'primary' ORDER BY groupid").fetchall()
    if version is None:
        raise SystemExit(f"{make_url(url).render_as_string()}: no Citus extension on this server")
    roles = ", ".join(f"{n} ({'coordinator' if g == 0 else 'worker'})" for n, g in nodes)
    return f"Citus {version[0]}; nodes {roles}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few repetitions (1.5-2 minutes, a third of it loading)")
    ap.add_argument("--size", default="10k", help="messages in the generated corpus (default 10k)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--citus-url", default=os.environ.get("HERMES_STORE_TEST_CITUS_URL"),
                    help="the Citus coordinator (default $HERMES_STORE_TEST_CITUS_URL)")
    ap.add_argument("--pg-url", default=os.environ.get("HERMES_STORE_TEST_PG_URL"),
                    help="a plain PostgreSQL server for reference (default $HERMES_STORE_TEST_PG_URL; '' for none)")
    ap.add_argument("--no-pg", action="store_true", help="leave the plain PostgreSQL server out")
    ap.add_argument("--floor-unprepared", action="store_true",
                    help="the floor plans every statement, as the library does (default: psycopg's, prepared after 5)")
    ap.add_argument("--json", default=None, help="results file (default bench/out/citus-results[-quick].json)")
    args = ap.parse_args(argv)
    if not args.citus_url:
        ap.error("no Citus coordinator: pass --citus-url or set HERMES_STORE_TEST_CITUS_URL")
    pg_url = None if args.no_pg else (args.pg_url or None)

    t_start = time.perf_counter()
    info = machine_info(args.citus_url)
    print("hermes_store on Citus: plain schema vs distributed schema" + (" (quick)" if args.quick else ""))
    print(f"  CPU       {info['cpu']} x {info['cores']} logical cores, {info['memory_gib']} GiB RAM")
    print(f"  platform  {info['platform']}   load average (1 min) at start: {info['loadavg_1m']}")
    print(f"  versions  Python {info['python']}, SQLAlchemy {info['sqlalchemy']}, psycopg {info['psycopg']}, "
          f"hermes_store {info['hermes_store']} @ {info['commit']}")
    settings = ", ".join(f"{k}={v}" for k, v in sorted(info["postgresql_settings"].items()))
    print(f"  citus     PostgreSQL {info['postgresql']}, {citus_info(args.citus_url)}; {settings}")
    if pg_url:
        server = make_url(pg_url)
        info["pg_server"] = {"postgresql": pg_load.server_version(pg_url), "settings": pg_load.server_settings(pg_url)}
        print(f"  pg        PostgreSQL {info['pg_server']['postgresql']} at {server.host}:{server.port}; "
              + ", ".join(f"{k}={v}" for k, v in sorted(info["pg_server"]["settings"].items())))
    floor = "plans every call (--floor-unprepared)" if args.floor_unprepared else "prepared after 5 executions"
    print(f"  floor     psycopg (bench/pg_baseline.py), {floor}; library statements not prepared (its default)")

    n = generate.parse_size(args.size)
    size = generate.label(n)
    path, meta = generate.ensure_db(n, args.seed, progress=print)
    print(f"  data      {path.name}: {meta['messages']:,} messages, {meta['sessions']:,} sessions "
          f"({meta['listed_sessions']:,} visible in listings)")
    prepared = not args.floor_unprepared
    tenants = [Tenant("plain", args.citus_url, False, prepared), Tenant("dist", args.citus_url, True, prepared)]
    if pg_url:
        tenants.append(Tenant("pg", pg_url, False, prepared))
    r = Run(tenants, size, args.quick)
    try:
        for t in tenants:
            t.create()
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=len(tenants)) as pool:  # the servers compute the tsvectors
            for fut in [pool.submit(t.load, path) for t in tenants]:
                fut.result()
        print(f"  loaded    {len(tenants)} targets at once in {time.perf_counter() - t0:.1f} s ("
              + ", ".join(f"{t.key} {t.load_s:.1f} s" for t in tenants) + ")")
        for t in tenants:
            print(f"  {t.key:<9} schema {t.schema}: {t.placement()}")
            t.open()
        print()
        print(f"== the same workload on every target ({size} messages); ratios are to plain ==")
        run_workload(r, meta)
        print()
        r.print_summary()
    finally:
        for t in tenants:
            with contextlib.suppress(Exception):
                t.close()
        for t in tenants:
            with contextlib.suppress(Exception):
                t.drop()
    if r.rep.checks:
        print("\nresult mismatches between targets (the figures may not compare like with like):")
        for c in r.rep.checks:
            print(f"  - {c}")
    elapsed = time.perf_counter() - t_start
    load = os.getloadavg()[0]
    print(f"load average (1 min) at end: {load:.2f} on {info['cores']} cores"
          + ("  -- other work was running: expect noisy figures" if load > 1.5 else ""))
    print(f"total time {elapsed:.1f} s")
    suffix = ("-quick" if args.quick else "") + ("-floor-unprepared" if args.floor_unprepared else "")
    out = Path(args.json) if args.json else OUT / f"citus-results{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": info, "quick": args.quick, "floor_prepared": prepared, "seed": args.seed,
                               "database": meta,
                               "targets": {t.key: {"schema": t.schema, "distributed": t.distributed,
                                                   "load_seconds": round(t.load_s, 1)} for t in tenants},
                               "results": r.rep.rows, "mismatches": r.rep.checks, "seconds": elapsed},
                              indent=1, ensure_ascii=False, default=str))
    print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
