"""``bench/run.py --async``: the asyncio API against the sync API and the plain floors, in one run.

    .venv/bin/python bench/run.py --quick --async --only async
    .venv/bin/python bench/run.py --backend postgresql --quick --async --only async

On the corpus the run loaded (the same file, or the same PostgreSQL database), one
event loop (asyncio's default) runs, interleaved round-robin after a warm-up as the
other groups do:

* ``aio``: :class:`hermes_store.aio.AsyncSessionDB`, every call awaited; over
  aiosqlite on SQLite, asyncpg on PostgreSQL (``postgresql+asyncpg://``);
* ``aio-pg3`` (PostgreSQL only): the same over async psycopg (``postgresql+psycopg://``,
  which :mod:`hermes_store.aio` keeps as psycopg's async driver);
* ``facade``: the sync ``SessionDB``, called on the loop's thread (nothing else runs);
* the floor every ratio is taken against: ``sqlite3`` (bench/baseline.py, the sync
  floor of the other groups) on SQLite, raw ``asyncpg`` (:class:`AsyncpgFloor`, no
  SQLAlchemy) on PostgreSQL;
* the other plain driver, shown beside it: ``aiosqlite`` (:class:`AioSqliteFloor`, the
  sqlite3 floor's SQL awaited statement by statement) on SQLite, ``psycopg``
  (bench/pg_baseline.py) on PostgreSQL.

Operations: single append (1 message per transaction, each implementation on its own
copy of the database, as in the ``writes`` group), word search (5 of the search
group's word queries) and one short-CJK query (``数据``), the listing page of 20
(``list_sessions_rich(limit=20)``), reading a conversation back (Hermes' replay of the
replay group's session, ``get_messages_as_conversation``), and 8-task aggregate append throughput: 8
concurrent writers in this one process, each appending to its own session:

* ``aio`` / ``aio-pg3``: 8 asyncio tasks sharing one ``AsyncSessionDB`` (its pool);
* ``asyncpg``: 8 tasks on an ``asyncpg.create_pool(min_size=8, max_size=8)``, one
  ``acquire()`` + transaction per append; ``aiosqlite``: 8 tasks, each with its own
  aiosqlite connection (so its own thread), ``BEGIN IMMEDIATE`` with a 60 s busy
  timeout (SQLite's own busy handler does the waiting, as in bench/writers.py);
* for comparison, the sync API: ``facade`` with 8 threads sharing one ``SessionDB``,
  and the sync floor with 8 threads, one connection each (``sqlite3`` with a 60 s
  busy timeout; ``psycopg``).

The group ends with the async facade against the sync one (issue 32's targets): per call,
aio p50 / facade p50 for append, read conversation, word and CJK search and listing
(target <= x1.25), and 8 tasks' aggregate msg/s over 8 threads' (target >= x0.9); a
missed target is marked ``(!)``.

For 8-task throughput the floor is ``asyncpg`` on PostgreSQL and ``aiosqlite`` (8
tasks, the same concurrency model as ``aio``) on SQLite.

The floors: the SQL of bench/baseline.py and bench/pg_baseline.py, unchanged except for
the placeholders (``$n`` for asyncpg), written the simplest correct way for each
driver. asyncpg keeps its default statement cache (each statement is prepared once per
connection, then Bind/Execute), as the psycopg floor keeps psycopg's default
``prepare_threshold``; an append is ``BEGIN``, ``INSERT … RETURNING id``, the counter
``UPDATE``, ``COMMIT`` (``async with conn.transaction()``). The psycopg floor runs the
listing's tip query unprepared (``prepare=False``); asyncpg has no unprepared form with
parameters, so there it is prepared (a page of 20 is the short array a generic plan
assumes anyway).

Event-loop lag (the figure tests/test_aio_concurrency.py once asserted, now printed
here, not checked): while 50 tasks at once each create a session, append two messages
(one with CJK) and search, for ``LAG_ROUNDS`` rounds on each library implementation's
own copy, a ticker asks to wake every 5 ms and records how late it woke; printed as
p50 / p99 / max lag and the number of ticks. A blocked loop shows as a lag as long as
the block. The tests check the cause instead: no blocking call runs on the loop's thread.

``st`` is statements per call on SQLite (the sqlite3 trace, under aiosqlite too) and
round trips on PostgreSQL: for asyncpg (library and floor), the requests written to its
socket while counted that it then waits on (a simple Query, or messages up to a Sync:
``prepare`` is one, ``Bind/Execute`` one, with the re-sent Parse of an unnamed statement
still one, ``BEGIN`` and ``COMMIT`` one each); for
psycopg, what bench/meter.py counts. ``cpu`` is this process's CPU per call
(aiosqlite's worker threads and SQLite itself included). Sync implementations are
called through a one-line coroutine so that every implementation is timed the same
way (a fraction of a microsecond).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import operator
import os
import re
import statistics
import threading
import time
from typing import Any
from collections.abc import Awaitable, Callable

import baseline
import generate
import meter
import pg_baseline
import pg_load
import timing
from baseline import Baseline, _n_calls, listing_page
from pg_baseline import PgBaseline

#: The word queries of the search group used here (rare to common, a phrase, a prefix, OR).
WORD_QUERIES = ["database migration", "timeout", '"rate limit"', "deploy*", "kubernetes OR helm"]
#: One 2-character CJK query of the search group (no trigram: a substring scan).
CJK_QUERY = "数据"
TASKS = 8
#: Busy timeout of the SQLite floors' connections under 8 concurrent writers.
FLOOR_BUSY_TIMEOUT_MS = 60_000

AsyncFn = Callable[[], Awaitable[Any]]

#: Loop-lag section: tasks at once, rounds of them, and the ticker's period (seconds).
LAG_TASKS = 50
LAG_ROUNDS = 3
LAG_PERIOD_S = 0.005


def _sync(fn: Callable[[], Any]) -> AsyncFn:
    async def call() -> Any:
        return fn()
    return call


def _loadavg() -> str:
    try:
        a, b, c = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{a:.2f} / {b:.2f} / {c:.2f} (1 / 5 / 15 min) on {os.cpu_count()} cores"


# --------------------------------------------------------------------------- floors
# The floors' SQL and the Python around it are bench/baseline.py's and bench/pg_baseline.py's
# own (imported, not copied): only the driver calls are written here, awaited.

def _dollar(sql: str) -> str:
    """psycopg's placeholders as asyncpg's: each ``%s`` the next ``$n``; a ``%(name)s`` numbered
    where the name first appears (a name used twice is one parameter, as psycopg sends it)."""
    numbers: dict[str, int] = {}
    counter = iter(range(1, 10_000))

    def number(m: re.Match[str]) -> str:
        if m.group(1) is None:
            return f"${next(counter)}"
        if m.group(1) not in numbers:
            numbers[m.group(1)] = next(counter)
        return f"${numbers[m.group(1)]}"

    return re.sub(r"%(?:\((\w+)\))?s", number, sql)


#: The psycopg floor's statements with asyncpg's placeholders (parameters in the same order).
_PG_INSERT = _dollar(pg_baseline._INSERT) + " RETURNING id"
_PG_BUMP = _dollar(pg_baseline._BUMP)
_PG_FTS = _dollar(pg_baseline._FTS)  # $1: the tsquery text, $2: the limit
_PG_ROOTS = _dollar(pg_baseline._ROOTS)
_PG_TIPS = _dollar(pg_baseline._TIPS)
_PG_ROWS = _dollar(pg_baseline._ROWS)  # $1 is a text[] (inferred from ``id = ANY($1)``)
_PG_REPLAY = f"SELECT {baseline.REPLAY_COLUMNS} FROM messages WHERE session_id = $1 AND active = 1 ORDER BY id"


class AsyncpgFloor:
    """The PostgreSQL floor (bench/pg_baseline.py) on one raw asyncpg connection."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    @classmethod
    async def connect(cls, dsn: str) -> AsyncpgFloor:
        import asyncpg

        return cls(await asyncpg.connect(dsn))

    async def close(self) -> None:
        await self.conn.close()

    # ------------------------------------------------------------------ writes
    @staticmethod
    async def append_on(conn: Any, session_id: str, m: dict[str, Any]) -> int:
        """Insert the message and bump the session's counters, in one transaction."""
        row = PgBaseline._row(session_id, m, time.time())
        async with conn.transaction():
            new_id = await conn.fetchval(_PG_INSERT, *row)
            await conn.execute(_PG_BUMP, 1, _n_calls(m.get("tool_calls")), session_id)
        return int(new_id)

    async def append_message(self, session_id: str, role: str, content: Any = None, **fields: Any) -> int:
        return await self.append_on(self.conn, session_id, {"role": role, "content": content, **fields})

    # ------------------------------------------------------------------ search
    async def search_fts(self, match: str, limit: int = 20) -> list[dict[str, Any]]:
        return pg_baseline._fts_hits(await self.conn.fetch(_PG_FTS, pg_baseline.tsquery(match), limit), match)

    async def search_substring(self, terms: list[str], limit: int = 20) -> list[dict[str, Any]]:
        # One parameter per term, used for the three columns (psycopg's floor sends it three times).
        where = " OR ".join(pg_baseline._like_term(t, f"${i}") for i, t in enumerate(terms, 1))
        args = [pg_baseline._like_pattern(t) for t in terms]
        rows = await self.conn.fetch(pg_baseline._substring_sql(where, f"${len(terms) + 1}"), *args, limit)
        return pg_baseline._substring_hits(rows, terms)

    # ------------------------------------------------------------------ replay
    async def conversation(self, session_id: str) -> list[dict[str, Any]]:
        rows = await self.conn.fetch(_PG_REPLAY, session_id)
        return [baseline.replay_turn(r, pg_baseline._decode_content(r[1])) for r in rows]

    # ------------------------------------------------------------------ listing
    async def list_sessions_rich(self, limit: int = 20, offset: int = 0) -> list[dict[str, Any]]:
        c = self.conn
        roots = [r[0] for r in await c.fetch(_PG_ROOTS, limit, offset)]
        if not roots:
            return []
        tips = {r[0]: r[1] for r in await c.fetch(_PG_TIPS, roots)}
        return listing_page(roots, tips, (dict(r) for r in await c.fetch(_PG_ROWS, list(tips.values()))))


class AioSqliteFloor:
    """The sqlite3 floor (bench/baseline.py) on one aiosqlite connection, every statement awaited."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    @classmethod
    async def open(cls, path: str, busy_timeout_ms: int = 100) -> AioSqliteFloor:
        import aiosqlite

        # check_same_thread=False: the statement meter sets its trace callback from the loop's thread.
        conn = await aiosqlite.connect(path, isolation_level=None, check_same_thread=False)
        for pragma in ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL", "PRAGMA foreign_keys=ON",
                       f"PRAGMA busy_timeout={int(busy_timeout_ms)}"):
            await conn.execute(pragma)
        return cls(conn)

    async def close(self) -> None:
        await self.conn.close()

    @property
    def sqlite3_connection(self) -> Any:
        return self.conn._conn

    async def append_message(self, session_id: str, role: str, content: Any = None, **fields: Any) -> int:
        row = Baseline._row(session_id, {"role": role, "content": content, **fields}, time.time())
        c = self.conn
        await c.execute("BEGIN IMMEDIATE")
        try:
            cur = await c.execute(baseline._INSERT, row)
            new_id = cur.lastrowid
            await c.execute(baseline._BUMP, (1, _n_calls(fields.get("tool_calls")), session_id))
            await c.execute("COMMIT")
        except BaseException:
            await c.execute("ROLLBACK")
            raise
        return int(new_id)

    async def _context(self, hits: list[dict[str, Any]]) -> None:
        c = self.conn
        for h in hits:
            args = baseline._context_args(h)
            prev = await c.execute_fetchall(baseline._PREV, args)
            nxt = await c.execute_fetchall(baseline._NEXT, args)
            baseline._set_context(h, prev[0] if prev else None, nxt[0] if nxt else None)

    async def search_fts(self, match: str, limit: int = 20, index: str = "messages_fts") -> list[dict[str, Any]]:
        rows = await self.conn.execute_fetchall(baseline._fts_sql(index), (match, limit))
        hits = [dict(zip(baseline._FTS_KEYS, r, strict=True)) for r in rows]
        await self._context(hits)
        return hits

    async def search_substring(self, terms: list[str], limit: int = 20) -> list[dict[str, Any]]:
        rows = await self.conn.execute_fetchall(*baseline._substring_query(terms, limit))
        hits = baseline._substring_hits(rows, terms)
        await self._context(hits)
        return hits

    async def conversation(self, session_id: str) -> list[dict[str, Any]]:
        rows = await self.conn.execute_fetchall(
            f"SELECT {baseline.REPLAY_COLUMNS} FROM messages WHERE session_id = ? AND active = 1 ORDER BY id",
            (session_id,))
        return [baseline.replay_turn(r, baseline._decode_content(r[1])) for r in rows]

    async def list_sessions_rich(self, limit: int = 20, offset: int = 0) -> list[dict[str, Any]]:
        c = self.conn
        roots = [r[0] for r in await c.execute_fetchall(baseline._ROOTS, (limit, offset))]
        if not roots:
            return []
        tips = {r[0]: r[1] for r in await c.execute_fetchall(baseline._TIPS, (json.dumps(roots),))}
        cur = await c.execute(baseline._ROWS, (json.dumps(list(tips.values())),))
        keys = [d[0] for d in cur.description]
        rows = [dict(zip(keys, r, strict=True)) for r in await cur.fetchall()]
        await cur.close()
        return listing_page(roots, tips, rows)


# --------------------------------------------------------------------------- meters

class AioEngineMeter(meter.EngineMeter):
    """:class:`meter.EngineMeter` on an AsyncEngine's ``sync_engine``: on SQLite the sqlite3
    connection to trace is under SQLAlchemy's adapter and aiosqlite's proxy."""

    def _install(self, dbapi_conn: Any) -> None:
        raw = getattr(dbapi_conn, "driver_connection", dbapi_conn)  # SQLAlchemy's adapted connection
        with contextlib.suppress(Exception):
            raw = raw._conn  # aiosqlite.Connection -> sqlite3.Connection
        super()._install(raw)


#: The protocol's Sync message: the end of an extended-protocol request the client waits on.
_SYNC = b"S\x00\x00\x00\x04"


def _awaits_reply(data: Any) -> bool:
    """Whether a write to asyncpg's socket ends a request it then waits for (one round
    trip): a simple Query, or extended-protocol messages up to a Sync. asyncpg may
    write one request in pieces (a Parse, then Bind/Execute/Sync): counted once."""
    head = bytes(data[:1])
    return head == b"Q" or bytes(data[-5:]) == _SYNC


class AsyncpgMeter(meter.Meter):
    """Round trips of asyncpg connections: the requests written to their sockets while started.

    ``engine``: the library's (sync face of its) engine; its connections are wrapped as they
    are checked out, and ``held()`` (the ones SessionDB keeps between calls) at start.
    ``conns()``: raw asyncpg connections (the floor)."""

    unit = "round trips"

    def __init__(self, engine: Any = None, held: Callable[[], list[Any]] = lambda: [],
                 conns: Callable[[], list[Any]] = lambda: []) -> None:
        super().__init__()
        self.engine = engine
        self.held = held
        self.conns = conns
        self.sa = 0 if engine is not None else None
        self._wrapped: list[Any] = []

    def _wrap(self, apg: Any) -> None:
        tr = getattr(apg, "_transport", None)
        if tr is None or any(t is tr for t in self._wrapped):
            return
        orig = tr.write

        def write(data: Any, orig: Any = orig) -> Any:
            if _awaits_reply(data):
                self.count += 1
            return orig(data)

        tr.write = write
        self._wrapped.append(tr)

    def _checkout(self, dbapi_conn: Any, _rec: Any, _proxy: Any) -> None:
        self._wrap(getattr(dbapi_conn, "driver_connection", dbapi_conn))

    def _before(self, *_a: Any) -> None:
        self.sa += 1  # type: ignore[operator]

    def start(self) -> None:
        if self.engine is not None:
            from sqlalchemy import event

            event.listen(self.engine, "checkout", self._checkout)
            event.listen(self.engine, "before_cursor_execute", self._before)
            for c in self.held():
                with contextlib.suppress(Exception):
                    self._wrap(c.connection.driver_connection)
        for c in self.conns():
            self._wrap(c)

    def stop(self) -> None:
        if self.engine is not None:
            from sqlalchemy import event

            for name, fn in (("checkout", self._checkout), ("before_cursor_execute", self._before)):
                with contextlib.suppress(Exception):
                    event.remove(self.engine, name, fn)
        for tr in self._wrapped:
            with contextlib.suppress(Exception):
                del tr.write
        self._wrapped = []


# --------------------------------------------------------------------------- timing

async def abench(impls: dict[str, AsyncFn], *, reps: int, warmup: int = 1, budget_s: float | None = None,
                 min_reps: int = 5, results: dict[str, Any] | None = None, slow_s: float = 5.0,
                 meters: dict[str, meter.Meter] | None = None,
                 probes: dict[str, dict[str, Any]] | None = None) -> dict[str, list[int]]:
    """:func:`run.bench` with every call awaited: the same plan (:class:`timing.Schedule`:
    warm-up, repetitions within ``budget_s``, rotating round-robin), then :func:`aprobe`."""
    plan = timing.Schedule(impls, reps=reps, warmup=warmup, budget_s=budget_s, min_reps=min_reps, slow_s=slow_s,
                           results=results)
    clock = time.perf_counter_ns
    for name, fn in plan.warm_ups():
        t = clock()
        value = await fn()
        plan.warmed(name, clock() - t, value)
    samples = plan.samples
    for name, fn in plan.timed():
        t = clock()
        await fn()
        samples[name].append(clock() - t)
    if probes is not None:
        for name in plan.names:
            probes[name] = await aprobe(impls[name], (meters or {}).get(name), plan.probe_calls(name))
    return samples


async def aprobe(fn: AsyncFn, m: meter.Meter | None, cpu_calls: int, count_calls: int | None = None
                 ) -> dict[str, Any]:
    """:func:`meter.probe` with the calls awaited (its bookkeeping, :func:`meter.cpu_timed` and
    :func:`meter.counted`): CPU per call over ``cpu_calls`` plain calls, then statements
    (round trips) per call over ``count_calls`` calls with ``m`` attached."""
    out: dict[str, Any] = {}
    with meter.cpu_timed(out, cpu_calls):
        for _ in range(cpu_calls):
            await fn()
    if m is None:
        return out
    n = meter.count_calls_for(cpu_calls, count_calls)
    with meter.counted(m, out, n):
        for _ in range(n):
            m.boundary()
            await fn()
    return out


def _pct(sorted_ms: list[float], q: float) -> float:
    return sorted_ms[min(len(sorted_ms) - 1, max(0, round(q * len(sorted_ms)) - 1))] if sorted_ms else 0.0


# --------------------------------------------------------------------------- the group

class _Group:
    """The implementations of one run of the group, and what they are opened on."""

    def __init__(self, rep: Any, bk: Any, target: str, meta: dict[str, Any], size: str, quick: bool,
                 stats: Any) -> None:
        self.bk = bk
        self.target = target
        self.meta = meta
        self.size = size
        self.quick = quick
        self.Stats = stats
        self.floor = "asyncpg" if bk.pg else "sqlite3"
        self.other = "psycopg" if bk.pg else "aiosqlite"  # the other plain driver, shown beside the floor
        self.libs = ("aio", "aio-pg3") if bk.pg else ("aio",)
        self.names = (*self.libs, "facade", self.floor, self.other)
        # Ratios against this group's floor; rows, checks and notes go to the run's report.
        self.rep = type(rep)(base=self.floor, judged=False)
        self.rep.rows, self.rep.checks = rep.rows, rep.checks
        self.rep.failures, self.rep.notes = rep.failures, rep.notes
        self.rep.name_width = 10
        self.main = rep
        self.closers: list[Callable[[], Awaitable[Any]]] = []
        #: (lib, operation) -> lib / facade: p50 per call, or 8 tasks' msg/s over 8 threads'.
        self.summary: dict[tuple[str, str], float] = {}

    # ------------------------------------------------------------------ opening
    def lib_target(self, name: str, target: str) -> tuple[Any, dict[str, Any]]:
        """(what AsyncSessionDB opens, its engine options) for library implementation ``name``."""
        if not self.bk.pg:
            return target, {}
        from sqlalchemy.engine import make_url

        url = make_url(target)
        if name == "aio-pg3":
            return url, {}  # postgresql+psycopg:// stays async psycopg (with ?prepare_threshold= under --prepared)
        opts = {"prepared_statements": True} if self.bk.prepare_threshold is not None else {}
        return url.difference_update_query(["prepare_threshold"]).set(drivername="postgresql+asyncpg"), opts

    async def open_all(self, targets: dict[str, str]) -> dict[str, Any]:
        """Every implementation opened on its target: name -> handle."""
        from hermes_store import SessionDB
        from hermes_store import aio

        h: dict[str, Any] = {}
        for name in self.libs:
            where, opts = self.lib_target(name, targets[name])
            h[name] = adb = aio.AsyncSessionDB(where, **opts)
            await adb.open()
            self.closers.append(adb.close)
        h["facade"] = SessionDB(targets["facade"])
        self.closers.append(_sync(h["facade"].close))
        if self.bk.pg:
            h["asyncpg"] = await AsyncpgFloor.connect(pg_load.conninfo(targets["asyncpg"]))
            self.closers.append(h["asyncpg"].close)
            h["psycopg"] = PgBaseline(pg_load.conninfo(targets["psycopg"]))
            self.closers.append(_sync(h["psycopg"].close))
        else:
            h["sqlite3"] = Baseline(targets["sqlite3"])
            self.closers.append(_sync(h["sqlite3"].close))
            h["aiosqlite"] = await AioSqliteFloor.open(targets["aiosqlite"])
            self.closers.append(h["aiosqlite"].close)
        return h

    async def close_all(self) -> None:
        while self.closers:
            with contextlib.suppress(Exception):
                await self.closers.pop()()

    async def settle(self, h: dict[str, Any]) -> None:
        """Let the libraries' background index upkeep finish (untimed): no run pays for the one before."""
        for lib in self.libs:
            await h[lib].wait_for_upkeep()
        h["facade"].wait_for_upkeep()

    def meters(self, h: dict[str, Any]) -> dict[str, meter.Meter]:
        out: dict[str, meter.Meter] = {}
        for name in self.libs:
            face = h[name]._db  # the LoopSessionDB (a SessionDB) under AsyncSessionDB
            held = functools.partial(meter.held_connections, face)
            out[name] = AsyncpgMeter(face.engine, held) if name == "aio" and self.bk.pg else \
                AioEngineMeter(face.engine, held=held)
        out["facade"] = meter.EngineMeter(h["facade"].engine, held=lambda: meter.held_connections(h["facade"]))
        if self.bk.pg:
            out["asyncpg"] = AsyncpgMeter(conns=lambda: [h["asyncpg"].conn])
            out["psycopg"] = meter.floor_meter(h["psycopg"])
        else:
            out["sqlite3"] = meter.floor_meter(h["sqlite3"])
            out["aiosqlite"] = meter.SqliteMeter(h["aiosqlite"].sqlite3_connection)
        return out

    def side_ratios(self, st: dict[str, Any], key: str = "p50_ms", op: str | None = None) -> None:
        """aio against the sync API and against the other plain driver (the table's ratio is to the floor);
        ``op``: the name the aio/facade ratio goes under in the closing summary."""
        parts = []
        for lib in self.libs:
            if op is not None:
                self.summary[(lib, op)] = st[lib][key] / st["facade"][key]
            parts.append(f"{lib}/facade x{st[lib][key] / st['facade'][key]:.2f}")
            parts.append(f"{lib}/{self.other} x{st[lib][key] / st[self.other][key]:.2f}")
        parts.append(f"{self.other}/{self.floor} x{st[self.other][key] / st[self.floor][key]:.2f}")
        parts.append(f"facade/{self.floor} x{st['facade'][key] / st[self.floor][key]:.2f}")
        print(f"    {key.split('_')[0]} ratios: " + "   ".join(parts))

    # ------------------------------------------------------------------ 1. single append
    async def single_append(self, h: dict[str, Any], admin: dict[str, Any]) -> None:
        rounds, per_round = (3, 100) if self.quick else (6, 300)
        convs = generate.sample_messages(rounds * per_round, seed=4242)[0]
        for m in convs:
            if "tool_calls" in m:
                m["tool_calls"] = json.loads(m["tool_calls"])
        sid = "bench-aio-append"
        for name in self.names:
            _new_session(self.bk, admin[name], sid)
        pos = {n: 0 for n in self.names}

        def next_msg(name: str) -> dict[str, Any]:
            m = convs[pos[name] % len(convs)]
            pos[name] += 1
            return m

        impls: dict[str, AsyncFn] = {}
        for name in self.libs:
            async def f_lib(name: str = name) -> Any:
                return await h[name].append_message(sid, **next_msg(name))
            impls[name] = f_lib
        impls["facade"] = _sync(lambda: h["facade"].append_message(sid, **next_msg("facade")))
        for name in (self.floor, self.other):
            if name in ("asyncpg", "aiosqlite"):
                async def f_floor(name: str = name) -> Any:
                    return await h[name].append_message(sid, **next_msg(name))
                impls[name] = f_floor
            else:
                impls[name] = _sync(lambda name=name: h[name].append_message(sid, **next_msg(name)))
        impls = {n: impls[n] for n in self.names}
        samples: dict[str, list[int]] = {n: [] for n in self.names}
        for _ in range(rounds):
            part = await abench(impls, reps=per_round, warmup=3)
            for n in self.names:
                samples[n] += part[n]
        meters = self.meters(h)
        # As the writes group: 100 calls for CPU, 50 counted (one cycle of the periodic upkeep).
        probes = {n: await aprobe(impls[n], meters[n], 100, 50) for n in self.names}
        st = self.rep.add("async: single append (1 message / transaction)", self.size, samples, unit="ops/s",
                          probes=probes)
        self.side_ratios(st, op="append")
        counts = {n: _message_count(self.bk, admin[n], sid) for n in self.names}
        self.rep.check("async append counters", len(set(counts.values())) == 1, str(counts))

    # ------------------------------------------------------------------ 2. + 3. search and listing
    async def reads(self, h: dict[str, Any]) -> None:
        from hermes_store.search.query import plan_search

        meters = self.meters(h)
        reps, budget, min_reps = (10, 1.5, 5) if self.quick else (30, 4.0, 7)
        sync_floor = h[self.other if self.bk.pg else self.floor]  # sqlite3 / psycopg: for the hit counts
        groups = {"word search": WORD_QUERIES, "CJK 2-char search (substring scan)": [CJK_QUERY]}
        print(f"  -- async: search [{self.size}] (each query, p50/p95 ms: {' / '.join(self.names)}; "
              f"x = aio/{self.floor} p50)")
        for group, queries in groups.items():
            agg: dict[str, list[int]] = {n: [] for n in self.names}
            agg_probes: dict[str, list[dict[str, Any]]] = {n: [] for n in self.names}
            for q in queries:
                plan = plan_search(q)
                if plan.kind == "substring":
                    terms = list(plan.terms)
                    hits = sync_floor.count_substring(terms)
                    floor_call: Callable[[Any], Any] = operator.methodcaller("search_substring", terms)
                else:
                    hits = sync_floor.count_matches(q)
                    floor_call = operator.methodcaller("search_fts", q)
                impls: dict[str, AsyncFn] = {}
                for name in self.libs:
                    impls[name] = lambda name=name, q=q: h[name].search_messages(q)
                impls["facade"] = _sync(lambda q=q: h["facade"].search_messages(q))
                for name in (self.floor, self.other):
                    if name in ("asyncpg", "aiosqlite"):
                        impls[name] = lambda name=name, fc=floor_call: fc(h[name])
                    else:
                        impls[name] = _sync(lambda name=name, fc=floor_call: fc(h[name]))
                impls = {n: impls[n] for n in self.names}
                first: dict[str, Any] = {}
                probes: dict[str, dict[str, Any]] = {}
                samples = await abench(impls, reps=reps, warmup=1, budget_s=budget, min_reps=min_reps,
                                       results=first, meters=meters, probes=probes)
                ids = {n: [x["id"] for x in first[n]] for n in self.names}
                for lib in self.libs:
                    self.rep.check(f"async search {q!r}: {lib} = facade", ids[lib] == ids["facade"],
                                   f"{ids[lib][:5]}... vs {ids['facade'][:5]}...")
                for fl in (self.floor, self.other):
                    same = ids["facade"] == ids[fl]
                    if not same and plan.kind != "substring":
                        same = set(ids["facade"]) == set(ids[fl]) or len(ids["facade"]) == len(ids[fl]) == 20
                    self.rep.check(f"async search {q!r}: facade = {fl}", same,
                                   f"{ids['facade'][:5]}... vs {ids[fl][:5]}... ({len(ids['facade'])} vs "
                                   f"{len(ids[fl])} hits)")
                st = {n: self.Stats.of(s) for n, s in samples.items()}
                line = "  ".join(f"{st[n]['p50_ms']:6.2f}/{st[n]['p95_ms']:6.2f}" for n in self.names)
                print(f"    {q!r:<22} {hits:>6,} rows  {line}   x{st['aio']['p50_ms'] / st[self.floor]['p50_ms']:.2f}")
                print(f"    {'':<22} {'':>6}  st, cpu ms/call: " + "   ".join(
                    f"{n} {probes[n].get('stmts_per_call', 0):3.0f}, {probes[n]['client_cpu_ms_per_call']:6.3f}"
                    for n in self.names))
                for n in self.names:
                    agg[n] += samples[n]
                    agg_probes[n].append(probes[n])
                    self.rep.rows.append({"op": f"async: {group}: {q}", "size": self.size, "impl": n,
                                          "matching_rows": hits, **st[n], "unit": "ms", **probes[n]})
            label = f"{len(queries)} queries" if len(queries) > 1 else repr(queries[0])
            st = self.rep.add(f"async: {group}, {label}", self.size, agg,
                              probes={n: meter.merge(agg_probes[n]) for n in self.names})
            self.side_ratios(st, op="word search" if group == "word search" else "CJK search")

        # listing: a page of 20
        impls = {}
        for name in self.libs:
            impls[name] = lambda name=name: h[name].list_sessions_rich(limit=20)
        impls["facade"] = _sync(lambda: h["facade"].list_sessions_rich(limit=20))
        for name in (self.floor, self.other):
            if name in ("asyncpg", "aiosqlite"):
                impls[name] = lambda name=name: h[name].list_sessions_rich(limit=20)
            else:
                impls[name] = _sync(lambda name=name: h[name].list_sessions_rich(limit=20))
        impls = {n: impls[n] for n in self.names}
        first = {}
        probes = {}
        samples = await abench(impls, reps=20 if self.quick else 40, warmup=1, budget_s=20.0, min_reps=3,
                               results=first, meters=meters, probes=probes)
        key = {n: [(r["id"], r.get("_lineage_root_id"), r["preview"], r["last_active"]) for r in first[n]]
               for n in self.names}
        for n in self.names:
            if n != "facade":
                self.rep.check(f"async listing page of 20: {n} = facade", key[n] == key["facade"],
                               f"{len(first[n])} vs {len(first['facade'])} rows")
        st = self.rep.add(f"async: list_sessions_rich: page of 20 (of {self.meta.get('listed_sessions', 0):,} "
                          f"visible, {self.meta['sessions']:,} sessions)", self.size, samples, probes=probes)
        self.side_ratios(st, op="listing")

        # read a conversation back: Hermes' replay of one session
        sid = self.meta["replay_session"]
        impls = {}
        for name in self.libs:
            impls[name] = lambda name=name: h[name].get_messages_as_conversation(sid)
        impls["facade"] = _sync(lambda: h["facade"].get_messages_as_conversation(sid))
        for name in (self.floor, self.other):
            if name in ("asyncpg", "aiosqlite"):
                impls[name] = lambda name=name: h[name].conversation(sid)
            else:
                impls[name] = _sync(lambda name=name: h[name].conversation(sid))
        impls = {n: impls[n] for n in self.names}
        first = {}
        probes = {}
        samples = await abench(impls, reps=20 if self.quick else 40, warmup=2, budget_s=20.0, min_reps=5,
                               results=first, meters=meters, probes=probes)
        for n in self.names:
            if n != "facade":
                self.rep.check(f"async read conversation: {n} = facade", first[n] == first["facade"],
                               f"{len(first[n])} vs {len(first['facade'])} messages")
        st = self.rep.add(f"async: read conversation ({self.meta['replay_messages']} messages)", self.size,
                          samples, probes=probes)
        self.side_ratios(st, op="read conversation")

    # ------------------------------------------------------------------ 4. 8 concurrent writers
    async def concurrent(self, h: dict[str, Any], admin: dict[str, Any], targets: dict[str, str]) -> None:
        per_task = 100 if self.quick else 300
        rounds = 2 if self.quick else 3
        pool_msgs = generate.sample_messages(1000, seed=5151)[0]
        for m in pool_msgs:
            if "tool_calls" in m:
                m["tool_calls"] = json.loads(m["tool_calls"])
        sync_floor = self.other if self.bk.pg else self.floor  # psycopg / sqlite3: the sync floor, in threads
        async_floor = self.floor if self.bk.pg else self.other  # asyncpg / aiosqlite: 8 tasks
        order = [*self.libs, async_floor, "facade", sync_floor]
        model = {lib: f"{TASKS} tasks, one AsyncSessionDB" for lib in self.libs}
        model["facade"] = f"{TASKS} threads, one SessionDB"
        model[async_floor] = (f"{TASKS} tasks, asyncpg pool of {TASKS}" if self.bk.pg
                              else f"{TASKS} tasks, a connection each")
        model[sync_floor] = f"{TASKS} threads, a connection each"
        base = async_floor
        print(f"  -- async: {TASKS} concurrent writers in one process [{self.size}] (each its own session, "
              f"{per_task} appends, 1 per transaction; {rounds} round{'s' if rounds > 1 else ''}; "
              f"cpu: this process's CPU ms per append; ratio: {base} msg/s / impl msg/s)")
        print(f"    {'impl':<10} {'how':<34} {'msg/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
              f"{'cpu ms':>7}  {'rows lost':>9}  counters  ratio")
        # extra handles for the floors' concurrency: a pool / 8 connections
        extra: dict[str, Any] = {}
        if self.bk.pg:
            import asyncpg

            extra["pool"] = await asyncpg.create_pool(pg_load.conninfo(targets["asyncpg"]), min_size=TASKS,
                                                      max_size=TASKS)
        else:
            extra["aconns"] = [await AioSqliteFloor.open(targets["aiosqlite"], FLOOR_BUSY_TIMEOUT_MS)
                               for _ in range(TASKS)]
        try:
            totals: dict[str, dict[str, Any]] = {n: {"lat": [], "wall": 0.0, "cpu": 0.0, "n": 0, "lost": 0,
                                                     "errors": [], "wrong": {}} for n in order}
            for r in range(-1, rounds):  # round -1: warm-up (2 appends per task, pool and connections grown)
                n_each = 2 if r < 0 else per_task
                rot = order[r % len(order):] + order[:r % len(order)] if r >= 0 else order
                for name in rot:
                    sids = [f"aio8-r{r + 1}-{name.replace('-', '')}-t{i}" for i in range(TASKS)]
                    for sid in sids:
                        _new_session(self.bk, admin[name], sid)
                    plans = [[pool_msgs[(i * 97 + k) % len(pool_msgs)] for k in range(n_each)] for i in range(TASKS)]
                    await self.settle(h)
                    gc.collect()
                    res = await self._one(name, h, extra, targets, sids, plans)
                    if r < 0:
                        continue
                    t = totals[name]
                    t["lat"] += res["lat"]
                    t["wall"] += res["wall"]
                    t["cpu"] += res["cpu"]
                    t["n"] += sum(len(p) for p in plans)
                    t["errors"] += res["errors"]
                    for sid, plan in zip(sids, plans, strict=True):
                        stored, counted = _session_rows(self.bk, admin[name], sid)
                        t["lost"] += max(0, len(plan) - stored)
                        if counted != len(plan) or stored != len(plan):
                            t["wrong"][sid] = {"rows": stored, "message_count": counted, "expected": len(plan)}
            rates = {n: (t["n"] / t["wall"] if t["wall"] else 0.0) for n, t in totals.items()}
            for name in order:
                t = totals[name]
                lat = sorted(x / 1e6 for x in t["lat"])
                rate = rates[name]
                ratio = f"x{rates[base] / rate:.2f}" if name != base and rate else ""
                p50, p99, mx = statistics.median(lat) if lat else 0.0, _pct(lat, 0.99), lat[-1] if lat else 0.0
                cpu = t["cpu"] * 1000 / t["n"] if t["n"] else 0.0
                print(f"    {name:<10} {model[name]:<34} {rate:>8,.0f} {p50:>8.2f} {p99:>8.2f} {mx:>8.1f} "
                      f"{cpu:>7.2f}  {t['lost']:>9}  {'exact' if not t['wrong'] else 'WRONG':<8}  {ratio}")
                self.rep.rows.append({"op": f"async: {TASKS} concurrent writers (one process)", "size": self.size,
                                      "impl": name, "model": model[name], "per_s": rate, "p50_ms": p50,
                                      "p99_ms": p99, "max_ms": mx, "client_cpu_ms": cpu, "appends": t["n"],
                                      "lost_rows": t["lost"], "counters_exact": not t["wrong"],
                                      "errors": t["errors"][:5], "unit": "msg/s"})
                self.rep.fail(f"async x{TASKS} {name}: rows lost", t["lost"] == 0 and not t["errors"],
                              f"{t['lost']} lost of {t['n']}; errors: {t['errors'][:3]}")
                self.rep.fail(f"async x{TASKS} {name}: counters", not t["wrong"],
                              json.dumps(dict(list(t["wrong"].items())[:3])))
            parts = [f"{lib}/{name} x{rates[name] / rates[lib]:.2f}" for lib in self.libs
                     for name in ("facade", sync_floor) if rates[lib]]
            print("    msg/s ratios: " + "   ".join(parts))
            for lib in self.libs:
                if rates["facade"]:
                    self.summary[(lib, f"{TASKS} tasks / {TASKS} threads")] = rates[lib] / rates["facade"]
        finally:
            if "pool" in extra:
                await extra["pool"].close()
            for c in extra.get("aconns", []):
                await c.close()

    async def loop_lag(self, h: dict[str, Any]) -> None:
        """p50 / p99 / max event-loop lag under 50 concurrent tasks, per library implementation."""
        print(f"  -- event-loop lag: {LAG_TASKS} tasks at once (create, 2 appends, search) x {LAG_ROUNDS} rounds; "
              f"a {LAG_PERIOD_S * 1000:g} ms ticker's lateness")
        print(f"    {'impl':<10} {'ticks':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'wall s':>8}")
        for name in self.libs:
            adb = h[name]
            lags: list[float] = []
            done = asyncio.Event()

            async def tick(done: asyncio.Event = done, lags: list[float] = lags) -> None:
                while not done.is_set():
                    due = time.perf_counter() + LAG_PERIOD_S
                    await asyncio.sleep(LAG_PERIOD_S)
                    lags.append(max(0.0, time.perf_counter() - due) * 1000)

            async def one(sid: str, i: int, adb: Any = adb) -> Any:
                await adb.create_session(sid, "cli")
                await adb.append_message(sid, "user", f"task {i} asks about kubernetes rollouts 数据库")
                await adb.append_message(sid, "assistant", f"answer {i}")
                return await adb.search_messages("kubernetes", limit=5)

            ticker = asyncio.create_task(tick())
            t0 = time.perf_counter()
            try:
                for r in range(LAG_ROUNDS):
                    await asyncio.gather(*(one(f"lag-{name.replace('-', '')}-r{r}-t{i}", i)
                                           for i in range(LAG_TASKS)))
            finally:
                done.set()
                await ticker
            wall = time.perf_counter() - t0
            lat = sorted(lags)
            p50, p99, mx = (statistics.median(lat), _pct(lat, 0.99), lat[-1]) if lat else (0.0, 0.0, 0.0)
            print(f"    {name:<10} {len(lat):>7} {p50:>8.2f} {p99:>8.2f} {mx:>8.1f} {wall:>8.2f}")
            self.rep.rows.append({"op": f"async: event-loop lag, {LAG_TASKS} tasks x {LAG_ROUNDS}", "size": self.size,
                                  "impl": name, "ticks": len(lat), "p50_ms": p50, "p99_ms": p99, "max_ms": mx,
                                  "wall_s": wall, "unit": "ms lag"})

    async def _one(self, name: str, h: dict[str, Any], extra: dict[str, Any], targets: dict[str, str],
                   sids: list[str], plans: list[list[dict[str, Any]]]) -> dict[str, Any]:
        """One concurrent run of implementation ``name``: latencies, wall time, CPU, errors."""
        clock = time.perf_counter_ns
        errors: list[str] = []
        lats: list[list[int]] = [[] for _ in sids]

        if name in ("facade", "sqlite3", "psycopg"):
            return await asyncio.to_thread(self._threads, name, h, targets, sids, plans)

        if name in self.libs:
            adb = h[name]

            async def append(i: int, m: dict[str, Any]) -> Any:
                return await adb.append_message(sids[i], **m)
        elif name == "asyncpg":
            pool = extra["pool"]

            async def append(i: int, m: dict[str, Any]) -> Any:
                async with pool.acquire() as c:
                    return await AsyncpgFloor.append_on(c, sids[i], m)
        else:
            conns = extra["aconns"]

            async def append(i: int, m: dict[str, Any]) -> Any:
                return await conns[i].append_message(sids[i], **m)

        async def task(i: int) -> None:
            lat = lats[i]
            try:
                for m in plans[i]:
                    t = clock()
                    await append(i, m)
                    lat.append(clock() - t)
            except Exception as exc:
                errors.append(f"task {i} append #{len(lat)}: {type(exc).__name__}: {exc}")

        cpu0 = time.process_time()
        t0 = clock()
        await asyncio.gather(*(task(i) for i in range(len(sids))))
        wall = (clock() - t0) / 1e9
        return {"lat": [x for lat in lats for x in lat], "wall": wall, "cpu": time.process_time() - cpu0,
                "errors": errors}

    def _threads(self, name: str, h: dict[str, Any], targets: dict[str, str], sids: list[str],
                 plans: list[list[dict[str, Any]]]) -> dict[str, Any]:
        """The sync API with 8 threads: one shared SessionDB, or one floor connection per thread."""
        clock = time.perf_counter_ns
        errors: list[str] = []
        lats: list[list[int]] = [[] for _ in sids]
        spans: list[tuple[int, int]] = []
        barrier = threading.Barrier(len(sids))
        opened: list[Any] = []
        if name == "facade":
            appenders = [h["facade"].append_message] * len(sids)
        elif name == "sqlite3":
            opened = [Baseline(targets["sqlite3"], busy_timeout_ms=FLOOR_BUSY_TIMEOUT_MS) for _ in sids]
            appenders = [b.append_message for b in opened]
        else:
            opened = [PgBaseline(pg_load.conninfo(targets["psycopg"])) for _ in sids]
            appenders = [b.append_message for b in opened]

        def worker(i: int) -> None:
            lat = lats[i]
            append = appenders[i]
            barrier.wait()
            t0 = clock()
            try:
                for m in plans[i]:
                    t = clock()
                    append(sids[i], **m)
                    lat.append(clock() - t)
            except Exception as exc:
                errors.append(f"thread {i} append #{len(lat)}: {type(exc).__name__}: {exc}")
            spans.append((t0, clock()))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(sids))]
        cpu0 = time.process_time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cpu = time.process_time() - cpu0
        for b in opened:
            b.close()
        wall = (max(e for _s, e in spans) - min(s for s, _e in spans)) / 1e9
        return {"lat": [x for lat in lats for x in lat], "wall": wall, "cpu": cpu, "errors": errors}


def _new_session(bk: Any, admin: Any, sid: str) -> None:
    ph = bk.ph
    admin.execute(f"INSERT INTO sessions (id, source, started_at) VALUES ({ph}, 'cli', {ph})", (sid, time.time()))


def _message_count(bk: Any, admin: Any, sid: str) -> int:
    return admin.execute(f"SELECT message_count FROM sessions WHERE id = {bk.ph}", (sid,)).fetchone()[0]


def _session_rows(bk: Any, admin: Any, sid: str) -> tuple[int, int]:
    """(message rows stored, the session's message_count)."""
    ph = bk.ph
    stored = admin.execute(f"SELECT count(*) FROM messages WHERE session_id = {ph}", (sid,)).fetchone()[0]
    return int(stored), int(_message_count(bk, admin, sid) or 0)


#: Issue 32's targets for the async facade against the sync one.
PER_CALL_TARGET = 1.25
TASKS_TARGET = 0.9


def _print_summary(g: _Group) -> None:
    """aio against the sync facade, one line per library implementation: per call (p50, lower is
    better, target <= x1.25) and 8 tasks' aggregate msg/s over 8 threads' (higher, target >= x0.9)."""
    print(f"  -- async facade / sync facade [{g.size}] ({g.bk.name}): per call p50 (target <= "
          f"x{PER_CALL_TARGET}); {TASKS} tasks / {TASKS} threads msg/s (target >= x{TASKS_TARGET})")
    for lib in g.libs:
        parts = []
        for (name, op), ratio in g.summary.items():
            if name != lib:
                continue
            met = ratio >= TASKS_TARGET if op.endswith("threads") else ratio <= PER_CALL_TARGET
            parts.append(f"{op} x{ratio:.2f}{'' if met else ' (!)'}")
            g.rep.rows.append({"op": f"async: {lib}/facade: {op}", "size": g.size, "impl": lib, "ratio": ratio,
                               "target_met": met, "unit": "ratio"})
        print(f"    {lib:<10} " + "   ".join(parts))


async def _run(g: _Group) -> None:
    bk = g.bk
    load0 = _loadavg()
    t0 = time.perf_counter()
    drivers = ("aio = AsyncSessionDB on asyncpg, aio-pg3 = on async psycopg" if bk.pg
               else "aio = AsyncSessionDB on aiosqlite")
    print(f"  -- asyncio API [{g.size}] ({drivers}; facade = sync SessionDB; floor {g.floor}, "
          f"beside it {g.other}); load average at start: {load0}")
    # Writers get private copies, one per implementation (see run.WriteEnv); reads share the loaded target.
    copies = {n: bk.copy(g.target, "async_" + n.replace("-", "")) for n in g.names}
    admin = {n: bk.admin(t) for n, t in copies.items()}
    try:
        h = await g.open_all(copies)
        try:
            await g.single_append(h, admin)
            await g.settle(h)
            await g.concurrent(h, admin, copies)
            await g.settle(h)
            await g.loop_lag(h)
        finally:
            await g.close_all()
        h = await g.open_all({n: g.target for n in g.names})
        try:
            await g.reads(h)
        finally:
            await g.close_all()
    finally:
        for c in admin.values():
            with contextlib.suppress(Exception):
                c.close()
        for t in copies.values():
            with contextlib.suppress(Exception):
                bk.discard(t)
    _print_summary(g)
    load1 = _loadavg()
    print(f"  -- asyncio API done in {time.perf_counter() - t0:.1f} s; load average at end: {load1}")
    g.rep.notes.append(f"async group [{g.size}] ({bk.name}): load average at start {load0}, at end {load1}")


def run_group(rep: Any, bk: Any, target: str, meta: dict[str, Any], size: str, quick: bool, stats: Any) -> None:
    """The ``async`` group of bench/run.py (``--async``): see the module docstring."""
    asyncio.run(_run(_Group(rep, bk, target, meta, size, quick, stats)))
