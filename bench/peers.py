"""hermes_store against the session stores a user would pick instead, in one run.

The same five operations on the same seeded workload (bench/peers_workload.py: 200
sessions x 50 agent messages, a tenth of them CJK, tool-call JSON) through:

* ``hermes_store``: ``SessionDB`` (and ``hermes_store.aio.AsyncSessionDB``);
* OpenAI Agents SDK: ``SQLiteSession`` (SQLite only) and ``SQLAlchemySession``;
* LangChain: ``SQLChatMessageHistory`` (langchain-community);
* the floor: plain ``sqlite3`` / ``psycopg`` on a minimal two-table store.

Each used as its own docs show (bench/peers_systems.py), each in its own process, one
after the other, on its own fresh SQLite file (WAL as the system configures itself) or
its own fresh PostgreSQL database (created on the server of ``--url``, dropped at the
end). The operations, after the 10,000 messages are loaded (one call per session):

1. one append to an existing conversation (p50 / p99);
2. read one 50-message conversation back;
3. search a word (5 words; the peers have no search, so a LIKE scan over their table,
   as a user would write it);
4. list sessions, a page of 20 (the peers have no listing: a query over their tables);
5. 8 writers in one process on one store, 100 messages each, each to its own new
   session: aggregate msg/s and append p99. Sync systems use 8 threads, async-only
   ones 8 asyncio tasks (hermes_store.aio too). The rows are counted afterwards.

Install the peers with ``pip install -e ".[test,bench]"``. The run prints one table
per backend with each figure and its ratio to hermes_store's, and saves the figures to
bench/out/peers-results[-quick].json. It exits 1 when one of our writers (or the
floor's) raised, lost or duplicated a row, or one of ours failed; a peer's failure
is printed as a finding.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.metadata
import importlib.util
import json
import multiprocessing as mp
import os
import platform
import queue as queue_mod
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import peers_systems  # noqa: E402
import peers_workload as wl  # noqa: E402
import timing  # noqa: E402

OUT = HERE / "out"
OPS = ("append", "read", "search", "list", "writers")
#: Package each peer needs (checked with find_spec, never imported by this process).
NEEDS = {"sqlitesession": "agents", "sqlalchemysession": "agents", "langchain": "langchain_community"}
CHILD_TIMEOUT_S = 3600.0
#: issue 32's targets, printed as info (a benchmark never fails on a figure).
TARGET_P99_MS = 20.0


@dataclass
class Plan:
    sessions: int
    per_session: int
    appends: int
    reads: int
    search_rounds: int
    lists: int
    writers: int
    per_writer: int
    writer_rounds: int
    warm: int


FULL = Plan(wl.SESSIONS, wl.PER_SESSION, 400, 200, 20, 200, wl.WRITERS, wl.PER_WRITER, 3, 10)
QUICK = Plan(wl.SESSIONS, wl.PER_SESSION, 150, 60, 6, 60, wl.WRITERS, wl.PER_WRITER, 1, 5)
SMOKE = Plan(10, 10, 10, 5, 1, 5, wl.WRITERS, 5, 1, 2)


# --------------------------------------------------------------------------- figures

def _pct(ms: list[float], q: float) -> float:
    s = sorted(ms)
    return s[min(len(s) - 1, max(0, round(q * len(s)) - 1))]


def summary(ns: list[int]) -> dict[str, float]:
    ms = [x / 1e6 for x in ns]
    if not ms:
        return {"n": 0}
    return {"n": len(ms), "p50_ms": statistics.median(ms), "p99_ms": _pct(ms, 0.99), "mean_ms": statistics.fmean(ms),
            "max_ms": max(ms)}


# --------------------------------------------------------------------------- one system (child process)

def _calls(a: Any, plan: Plan, sids: list[str], extra: list[dict[str, Any]]) -> dict[str, list[Callable[[], Any]]]:
    """Each timed operation as its list of calls, warm-up calls first."""
    p = functools.partial
    w = plan.warm
    n = len(sids)
    return {
        "append": [p(a.append, sids[(i * 7) % n], extra[i % len(extra)]) for i in range(plan.appends + w)],
        "read": [p(a.read, sids[(i * 13 + 1) % n]) for i in range(plan.reads + w)],
        "search": [p(a.search, word) for _ in range(plan.search_rounds + 1) for word in wl.SEARCH_WORDS],
        "list": [a.list_sessions for _ in range(plan.lists + w)],
    }


def _warm_count(op: str, plan: Plan) -> int:
    return len(wl.SEARCH_WORDS) if op == "search" else plan.warm


def _writer_plans(plan: Plan, rnd: int, extra: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    out = []
    for k in range(plan.writers):
        base = (rnd * plan.writers + k) * 131
        out.append((f"writer-r{rnd}-{k}", [extra[(base + i) % len(extra)] for i in range(plan.per_writer)]))
    return out


def _check(a: Any, counted: list[tuple[int, int | None]], wplans: list[tuple[str, list[dict[str, Any]]]],
           acked: list[list[dict[str, Any]]]) -> list[str]:
    """What is wrong with the writers' sessions after a round (nothing: []): every
    acknowledged append stored once (rows and the session's own counter, where it has
    one), nothing stored for an append that raised."""
    wrong = []
    for (sid, _), (rows, counter), ok in zip(wplans, counted, acked, strict=True):
        want = sum(a.rows_for(m) for m in ok)
        if rows != want:
            wrong.append(f"{sid}: {rows} rows stored, {want} acknowledged")
        if counter is not None and counter != len(ok):
            wrong.append(f"{sid}: counter {counter}, {len(ok)} appends acknowledged")
    return wrong


def _writers_sync(a: Any, wplans: list[tuple[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """N threads, each appending its plan to its session, started together."""
    barrier = threading.Barrier(len(wplans))
    lats: list[list[int]] = [[] for _ in wplans]
    acked: list[list[dict[str, Any]]] = [[] for _ in wplans]
    spans: list[tuple[int, int]] = [(0, 0)] * len(wplans)
    errors: list[str] = []
    clock = time.perf_counter_ns

    def run(k: int) -> None:
        sid, msgs = wplans[k]
        append = a.writer(sid)
        barrier.wait()
        t0 = clock()
        for i, m in enumerate(msgs):
            t = clock()
            try:
                append(m)
            except Exception as exc:  # counted, and the writer goes on as an application would
                errors.append(f"writer {k} append #{i}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
                continue
            lats[k].append(clock() - t)
            acked[k].append(m)
        spans[k] = (t0, clock())

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(wplans))]
    cpu0 = time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = (max(e for _, e in spans) - min(s for s, _ in spans)) / 1e9
    return {"lat": [x for lat in lats for x in lat], "wall": wall, "cpu": time.process_time() - cpu0, "errors": errors,
            "acked": acked}


async def _writers_async(a: Any, wplans: list[tuple[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """N tasks on this event loop, each appending its plan to its session."""
    lats: list[list[int]] = [[] for _ in wplans]
    acked: list[list[dict[str, Any]]] = [[] for _ in wplans]
    errors: list[str] = []
    clock = time.perf_counter_ns

    async def run(k: int) -> None:
        sid, msgs = wplans[k]
        append = a.writer(sid)
        for i, m in enumerate(msgs):
            t = clock()
            try:
                await append(m)
            except Exception as exc:  # counted, and the task goes on as an application would
                errors.append(f"task {k} append #{i}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
                continue
            lats[k].append(clock() - t)
            acked[k].append(m)

    cpu0 = time.process_time()
    t0 = clock()
    await asyncio.gather(*(run(k) for k in range(len(wplans))))
    wall = (clock() - t0) / 1e9
    return {"lat": [x for lat in lats for x in lat], "wall": wall, "cpu": time.process_time() - cpu0, "errors": errors,
            "acked": acked}


def _finish(a: Any, res: dict[str, Any], rounds: list[dict[str, Any]], plan: Plan) -> None:
    lat = [x for r in rounds for x in r["lat"]]
    rates = [len(r["lat"]) / r["wall"] if r["wall"] else 0.0 for r in rounds]
    res["writers"] = {
        **summary(lat), "msg_s": statistics.median(rates), "rounds_msg_s": rates,
        "cpu_per_append_ms": 1000 * sum(r["cpu"] for r in rounds) / max(1, len(lat)),
        "raised": sum(len(r["errors"]) for r in rounds),
        "errors": [e for r in rounds for e in r["errors"]][:5],
        "wrong": [w for r in rounds for w in r["wrong"]][:5],
        "exact": all(not r["wrong"] for r in rounds),
        "expected_appends": plan.writers * plan.per_writer * plan.writer_rounds,
        "model": a.writers_model,
    }


def _per_word(lat: list[int]) -> dict[str, float]:
    """p50 per search word (the calls go round the words in order)."""
    k = len(wl.SEARCH_WORDS)
    return {w: statistics.median(lat[i::k]) / 1e6 for i, w in enumerate(wl.SEARCH_WORDS) if lat[i::k]}


def _size(x: Any) -> int:
    try:
        return len(x)
    except TypeError:
        return -1


def _analyze(backend: str, target: str) -> None:
    """PostgreSQL: ANALYZE the freshly loaded database, as autovacuum would soon after a
    load like this, so no system is timed on a planner without statistics."""
    if backend != "postgresql":
        return
    import psycopg

    with psycopg.connect(peers_systems.pg_conninfo(target), autocommit=True) as c:
        c.execute("ANALYZE")


def run_sync(a: Any, target: str, plan: Plan, ops: list[str]) -> dict[str, Any]:
    res: dict[str, Any] = {}
    corpus = wl.corpus(plan.sessions, plan.per_session)
    extra = wl.extra_messages(2000)
    a.open(target)
    try:
        t0 = time.perf_counter()
        for sid, msgs in corpus:
            a.load(sid, msgs)
        res["load_s"] = time.perf_counter() - t0
        if hasattr(a, "settle"):
            a.settle()
        _analyze(a.backend, target)
        calls = _calls(a, plan, [s for s, _ in corpus], extra)
        for op in ops:
            if op == "writers":
                continue
            warm = _warm_count(op, plan)
            sizes = [_size(f()) for f in calls[op][:warm]]
            lat = []
            for f in calls[op][warm:]:
                t = time.perf_counter_ns()
                f()
                lat.append(time.perf_counter_ns() - t)
            res[op] = summary(lat)
            res[op]["sizes"] = sizes
            if op == "search":
                res[op]["per_word_p50_ms"] = _per_word(lat)
        if "writers" in ops:
            rounds = []
            for rnd in range(plan.writer_rounds):
                wplans = _writer_plans(plan, rnd, extra)
                for sid, _ in wplans:
                    a.create(sid)
                r = _writers_sync(a, wplans)
                r["wrong"] = _check(a, [a.count(sid) for sid, _ in wplans], wplans, r.pop("acked"))
                rounds.append(r)
            _finish(a, res, rounds, plan)
    finally:
        a.close()
    return res


async def run_async(a: Any, target: str, plan: Plan, ops: list[str]) -> dict[str, Any]:
    res: dict[str, Any] = {}
    corpus = wl.corpus(plan.sessions, plan.per_session)
    extra = wl.extra_messages(2000)
    await a.open(target)
    try:
        t0 = time.perf_counter()
        for sid, msgs in corpus:
            await a.load(sid, msgs)
        res["load_s"] = time.perf_counter() - t0
        if hasattr(a, "settle"):
            await a.settle()
        await asyncio.to_thread(_analyze, a.backend, target)
        calls = _calls(a, plan, [s for s, _ in corpus], extra)
        for op in ops:
            if op == "writers":
                continue
            warm = _warm_count(op, plan)
            sizes = [_size(await f()) for f in calls[op][:warm]]
            lat = []
            for f in calls[op][warm:]:
                t = time.perf_counter_ns()
                await f()
                lat.append(time.perf_counter_ns() - t)
            res[op] = summary(lat)
            res[op]["sizes"] = sizes
            if op == "search":
                res[op]["per_word_p50_ms"] = _per_word(lat)
        if "writers" in ops:
            rounds = []
            for rnd in range(plan.writer_rounds):
                wplans = _writer_plans(plan, rnd, extra)
                for sid, _ in wplans:
                    await a.create(sid)
                r = await _writers_async(a, wplans)
                r["wrong"] = _check(a, [await a.count(sid) for sid, _ in wplans], wplans, r.pop("acked"))
                rounds.append(r)
            _finish(a, res, rounds, plan)
    finally:
        await a.close()
    return res


def child(system: str, backend: str, target: str, plan: dict[str, Any], ops: list[str], out: Any) -> None:
    """One system, in a process of its own: every operation; the figures go to ``out``."""
    try:
        a = peers_systems.SYSTEMS[system](backend)
        p = Plan(**plan)
        res = asyncio.run(run_async(a, target, p, ops)) if a.is_async else run_sync(a, target, p, ops)
        res.update(name=a.name, notes=a.notes, writers_model=a.writers_model)
        res["load_msg_s"] = p.sessions * p.per_session / res["load_s"] if res.get("load_s") else None
        out.put(("ok", res))
    except BaseException as exc:
        out.put(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"))


# --------------------------------------------------------------------------- the run (parent)

def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def header(pg_url: str | None) -> dict[str, Any]:
    cpu = timing.cpu_model()
    commit = timing.commit_of(ROOT)
    info: dict[str, Any] = {
        "cpu": cpu, "cores": os.cpu_count(), "loadavg_1m": os.getloadavg()[0], "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version, "commit": commit,
        "versions": {d: _version(d) for d in ("hermes-store", "openai-agents", "langchain-community", "langchain-core",
                                              "sqlalchemy", "aiosqlite", "asyncpg", "psycopg")},
    }
    if pg_url:
        import pg_load

        info["postgresql"] = pg_load.server_version(pg_url)
        info["postgresql_settings"] = pg_load.server_settings(pg_url)
    return info


def run_system(system: str, backend: str, target: str, plan: Plan, ops: list[str]) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=child, args=(system, backend, target, asdict(plan), ops, q), name=f"peers-{system}")
    proc.start()
    try:
        status, payload = q.get(timeout=CHILD_TIMEOUT_S)
    except queue_mod.Empty:
        status, payload = "error", f"no result within {CHILD_TIMEOUT_S:.0f} s"
    proc.join(60)
    if proc.is_alive():
        proc.kill()
        proc.join()
    if status != "ok":
        return {"error": payload}
    return dict(payload)


def _fmt_ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.2f} ms" if v < 100 else f"{v:,.0f} ms"


def _fmt_rate(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}/s"


#: Table rows: (label, how to read the figure out of a result, "ms" or "rate").
ROWS: list[tuple[str, Callable[[dict[str, Any]], Any], str]] = [
    ("load 10k msgs, one call per session", lambda r: r.get("load_msg_s"), "rate"),
    ("1. one append, p50", lambda r: r.get("append", {}).get("p50_ms"), "ms"),
    ("1. one append, p99", lambda r: r.get("append", {}).get("p99_ms"), "ms"),
    ("2. read a 50-msg conversation, p50", lambda r: r.get("read", {}).get("p50_ms"), "ms"),
    ("3. search a word (5 words), p50", lambda r: r.get("search", {}).get("p50_ms"), "ms"),
    ("3. search, absent word (LIKE reads all), p50",
     lambda r: r.get("search", {}).get("per_word_p50_ms", {}).get(wl.SEARCH_WORDS[-1]), "ms"),
    ("4. list sessions, page of 20, p50", lambda r: r.get("list", {}).get("p50_ms"), "ms"),
    ("5. 8 writers: aggregate", lambda r: r.get("writers", {}).get("msg_s"), "rate"),
    ("5. 8 writers: append p50", lambda r: r.get("writers", {}).get("p50_ms"), "ms"),
    ("5. 8 writers: append p99", lambda r: r.get("writers", {}).get("p99_ms"), "ms"),
]


def table(backend: str, results: dict[str, dict[str, Any]], plan: Plan) -> tuple[str, str]:
    """(plain text table, Markdown table) of one backend's results."""
    names = list(results)
    ours = results.get("ours", {})
    head = ["operation"] + [results[n].get("name", n) for n in names]
    body: list[list[str]] = []
    for label, get, kind in ROWS:
        if plan.sessions != wl.SESSIONS:
            label = label.replace("10k msgs", f"{plan.sessions * plan.per_session} msgs")
        if plan.per_session != wl.PER_SESSION:
            label = label.replace("50-msg", f"{plan.per_session}-msg")
        if plan.per_writer != wl.PER_WRITER:
            label = label.replace("8 writers", f"8 writers x {plan.per_writer}")
        row = [label]
        base = get(ours) if "error" not in ours else None
        for n in names:
            r = results[n]
            v = None if "error" in r else get(r)
            cell = _fmt_ms(v) if kind == "ms" else _fmt_rate(v)
            if v is not None and base and n != "ours":
                cell += f" ×{v / base:.2f}"
            row.append(cell)
        body.append(row)
    row = ["5. writers: rows exact / appends raised"]
    for n in names:
        w = results[n].get("writers")
        exact = "-" if not w else "yes" if w["exact"] else "**NO**"
        row.append(exact if not w else f"{exact} / {w['raised']} of {w['expected_appends']}")
    body.append(row)
    row = ["5. writers are"]
    for n in names:
        w = results[n].get("writers")
        row.append("-" if not w else w["model"].split(",")[0])
    body.append(row)
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    text = "\n".join("  " + "  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r))
                     for r in [head, *body])
    md = "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                   + ["| " + " | ".join(r) + " |" for r in body])
    return text, md


def notes(backend: str, results: dict[str, dict[str, Any]]) -> list[str]:
    out = []
    for n, r in results.items():
        if "error" in r:
            out.append(f"  {n}: FAILED: {r['error'].strip().splitlines()[0]}")
            continue
        nt = r.get("notes", {})
        hits = "/".join(str(x) for x in r.get("search", {}).get("sizes", []))
        per_word = " ".join(f"{w} {v:.2f}" for w, v in r.get("search", {}).get("per_word_p50_ms", {}).items())
        out.append(f"  {r['name']} ({nt.get('driver', '?')}): search = {nt.get('search', '?')}"
                   + (f" (hits per word: {hits}; p50 ms: {per_word})" if hits else "")
                   + f"; list = {nt.get('list', '?')}")
        w = r.get("writers")
        if w and (w["wrong"] or w["errors"]):
            out.append(f"    writers: {w['raised']} appends raised, e.g. {w['errors'][:2]}; wrong: {w['wrong'][:3]}")
    ours, aio = results.get("ours", {}), results.get("aio", {})
    ow = ours.get("writers") if "error" not in ours else None
    if ow:
        line = f"  issue 32 target, 8 writers: append p99 {ow['p99_ms']:.1f} ms (target ≤ {TARGET_P99_MS:g} ms: " \
               f"{'met' if ow['p99_ms'] <= TARGET_P99_MS else 'missed'})"
        peer = results.get("sqlitesession", {}).get("writers")
        if peer:
            ok = ow["msg_s"] >= peer["msg_s"]
            line += f"; aggregate {ow['msg_s']:,.0f} vs SQLiteSession {peer['msg_s']:,.0f} msg/s " \
                    f"(target ≥: {'met' if ok else 'missed'}, ×{ow['msg_s'] / peer['msg_s']:.2f})"
        out.append(line)
    if ow and aio.get("writers") and "append" in aio and "append" in ours:
        per_call = aio["append"]["p50_ms"] / ours["append"]["p50_ms"]
        out.append(f"  issue 32 target, async: append p50 aio/sync ×{per_call:.2f} (≤ ×1.25), "
                   f"8 tasks / 8 threads ×{aio['writers']['msg_s'] / ow['msg_s']:.2f} (≥ ×0.9)")
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="hermes_store against OpenAI Agents SDK's SQLiteSession / SQLAlchemySession and LangChain's "
                    "SQLChatMessageHistory, plus a plain-driver floor: the same five operations, one process per "
                    "system, one table per backend with ratios to hermes_store.")
    ap.add_argument("--quick", action="store_true",
                    help="fewer repetitions, one writers round (2-3 minutes for both backends)")
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny run of our own side and the floor only, on SQLite (no peer package needed)")
    ap.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both",
                    help="both (default) skips PostgreSQL when no --url / $HERMES_STORE_TEST_PG_URL is set")
    ap.add_argument("--url", default=os.environ.get("HERMES_STORE_TEST_PG_URL"),
                    help="a PostgreSQL server (SQLAlchemy URL); a fresh database per system is created on it")
    ap.add_argument("--only", nargs="+", default=[], metavar="NAME",
                    help=f"systems ({', '.join(peers_systems.SYSTEMS)}) and/or operations ({', '.join(OPS)}); "
                         "hermes_store (ours) always runs when another system does, for the ratios")
    ap.add_argument("--markdown", action="store_true", help="also print each table as Markdown")
    args = ap.parse_args(argv)
    unknown = [n for n in args.only if n not in peers_systems.SYSTEMS and n not in OPS]
    if unknown:
        ap.error(f"--only: unknown {', '.join(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    plan = SMOKE if args.smoke else QUICK if args.quick else FULL
    systems = [n for n in args.only if n in peers_systems.SYSTEMS] or list(peers_systems.SYSTEMS)
    if args.smoke:
        systems = [n for n in systems if n in peers_systems.OWN]
    if "ours" not in systems:
        systems.insert(0, "ours")
    ops = [o for o in OPS if o in args.only] or list(OPS)
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    if args.smoke:
        backends = ["sqlite"]
    if "postgresql" in backends and not args.url:
        if args.backend == "postgresql":
            print("peers.py: --backend postgresql needs --url or $HERMES_STORE_TEST_PG_URL", file=sys.stderr)
            return 2
        print("no PostgreSQL server (--url / $HERMES_STORE_TEST_PG_URL): SQLite only")
        backends = ["sqlite"]
    missing = {n: NEEDS[n] for n in systems if n in NEEDS and importlib.util.find_spec(NEEDS[n]) is None}
    if missing:
        print(f"not installed, skipped: {', '.join(missing)} (pip install -e \".[bench]\")")
        systems = [n for n in systems if n not in missing]

    info = header(args.url if "postgresql" in backends else None)
    print(f"peers: {info['cpu']}, {info['cores']} cores, load {info['loadavg_1m']:.2f}, Python {info['python']}, "
          f"SQLite {info['sqlite']}" + (f", PostgreSQL {info['postgresql']}" if "postgresql" in info else ""))
    print("  " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()) + f"; commit {info['commit']}")
    print(f"  workload: {plan.sessions} sessions x {plan.per_session} messages (~10% CJK, tool calls), "
          f"{plan.appends} appends, {plan.reads} reads, {plan.search_rounds} x {len(wl.SEARCH_WORDS)} searches "
          f"({', '.join(wl.SEARCH_WORDS)}), {plan.lists} listings, {plan.writers} writers x {plan.per_writer} "
          f"x {plan.writer_rounds} round(s); one process per system")

    all_results: dict[str, Any] = {"machine": info, "plan": asdict(plan), "backends": {}}
    failed = False
    OUT.mkdir(exist_ok=True)
    for backend in backends:
        results: dict[str, dict[str, Any]] = {}
        names = [n for n in systems if backend == "sqlite" or n not in peers_systems.SQLITE_ONLY]
        workdir = Path(tempfile.mkdtemp(prefix="peers-", dir=OUT)) if backend == "sqlite" else None
        dbs: list[str] = []
        load0 = os.getloadavg()[0]
        print(f"\n== {backend} ==")
        try:
            for n in names:
                if workdir is not None:
                    target = str(workdir / f"{n}.db")
                else:
                    import pg_load

                    name = f"hs_peers_{os.getpid()}_{n}"
                    pg_load.drop_database(args.url, name)
                    target = pg_load.create_database(args.url, name)
                    dbs.append(name)
                t0 = time.perf_counter()
                results[n] = r = run_system(n, backend, target, plan, ops)
                state = f"FAILED: {r['error'].strip().splitlines()[0]}" if "error" in r else "ok"
                print(f"  {n:<18} {time.perf_counter() - t0:6.1f} s  {state}", flush=True)
                if "error" in r:
                    print(r["error"], file=sys.stderr)
                # A peer's failure is a finding to print; ours (and the floor's) fail the run.
                if n in peers_systems.OWN and ("error" in r or (r.get("writers") and (
                        not r["writers"]["exact"] or r["writers"]["raised"]))):
                    failed = True
        finally:
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
            if dbs:
                import pg_load

                for name in dbs:
                    pg_load.drop_database(args.url, name)
        text, md = table(backend, results, plan)
        load1 = os.getloadavg()[0]
        print(f"\n{backend} (load average {load0:.1f} at the start, {load1:.1f} at the end): the figure, then ×: "
              "the system's figure / hermes_store's (ms: lower is better; /s: higher is better)")
        print(text)
        print("\n".join(notes(backend, results)))
        if args.markdown:
            print("\n" + md)
        all_results["backends"][backend] = {"loadavg_1m": [load0, load1], "systems": results}
    if not args.smoke:
        path = OUT / ("peers-results-quick.json" if args.quick else "peers-results.json")
        path.write_text(json.dumps(all_results, indent=1, default=str))
        print(f"\nresults: {path.relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
