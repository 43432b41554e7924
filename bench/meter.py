"""Where a call's time goes: statements per call and client CPU per call.

``run.py`` times every operation first, with nothing attached. Only *after* an
operation's timed loop does :func:`probe` make a few extra calls per implementation:

* **client CPU**: ``time.process_time_ns()`` around ``cpu_calls`` plain calls (no
  counters attached), reported as ms of CPU of this process per call. On SQLite that is
  Python, the driver *and* the SQLite engine (it runs in the process); on PostgreSQL
  it is the client only (Python, SQLAlchemy, psycopg, libpq), never the server.
* **statements per call**: ``count_calls`` more calls with a :class:`Meter` attached.

What a meter counts (the same rule for the library and the floor of one backend):

* SQLite (``statements``): every top-level statement the ``sqlite3`` connection runs,
  seen by ``Connection.set_trace_callback``: what SQLAlchemy sends, what the library
  sends straight to the DB-API connection, ``BEGIN [IMMEDIATE]``/``COMMIT``/``ROLLBACK``,
  ``PRAGMA``\\ s (the facade's periodic ``wal_checkpoint`` included), and each row of an
  ``executemany`` once. Not counted: what SQLite runs *inside* a statement (trigger
  bodies, FTS5's shadow-table statements: the trace shows them with a ``-- `` prefix),
  the re-report of a statement at the start of each trigger sub-program (the same text
  again, collapsed), and FTS5's own reads of its ``'main'.'…_config'`` table and
  ``PRAGMA 'main'.data_version`` when a statement is prepared. The library's meter also
  counts the statements that went through SQLAlchemy (``before_cursor_execute``),
  stored as ``stmts_sa_per_call``: the rest is what it sent to the driver directly.
* PostgreSQL (``round trips``): library: one per ``before_cursor_execute`` (an
  ``executemany`` once: psycopg pipelines it), plus the ``BEGIN`` psycopg sends before
  the first statement of a transaction (its own round trip; none in driver autocommit,
  where the library sends its own BEGIN as a statement) and the ``COMMIT`` /
  ``ROLLBACK`` psycopg sends when SQLAlchemy ends a transaction the server has open
  (read from the driver's transaction status at the ``commit`` / ``rollback`` event).
  Floor: a counting wrapper around ``PgBaseline.conn`` for the probe: one per
  ``execute`` / ``cursor().execute`` / ``cursor().executemany``, two per
  ``transaction()`` block (``BEGIN``/``SAVEPOINT`` and ``COMMIT``/``RELEASE``/``ROLLBACK``).
  Not seen on either side: psycopg's connection setup and SQLAlchemy's pool pre-ping
  (the facade keeps its connections, so neither happens per call).

The library's SQLite connections get the trace callback when they are checked out of
the pool during the probe (``event.listen(engine, "checkout")``), and the ones
``SessionDB`` keeps checked out between calls (``SessionDB._idle``, read here because
they are never checked out again) get it at :meth:`Meter.start`. Everything is
detached at :meth:`Meter.stop`, so timed loops never run with a counter attached.
"""

from __future__ import annotations

import contextlib
import gc
import re
import sqlite3
import time
from typing import Any
from collections.abc import Callable, Iterator

#: libpq's PQTRANS_IDLE: no transaction open at the server.
_IDLE = 0
#: FTS5 reading its config while a statement is prepared (not sent by anyone).
_FTS_PREPARE = re.compile(r"^(PRAGMA 'main'\.|SELECT .* FROM 'main'\.')")


class Meter:
    """Counts statements while started; ``count`` is cumulative."""

    unit = "statements"

    def __init__(self) -> None:
        self.count = 0
        self.sa: int | None = None

    def start(self) -> None:  # pragma: no cover - interface
        pass

    def stop(self) -> None:  # pragma: no cover - interface
        pass

    def boundary(self) -> None:
        """Between two calls (a statement repeated by the next call is a new one)."""


class _Trace:
    """A ``sqlite3`` trace callback counting top-level statements (see the module doc)."""

    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self.last: str | None = None

    def __call__(self, sql: str) -> None:
        if sql.startswith("--") or sql == self.last or _FTS_PREPARE.match(sql):
            return
        self.last = sql
        self.meter.count += 1


class SqliteMeter(Meter):
    """The sqlite3 floor: ``conn.set_trace_callback`` while started."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__()
        self.conn = conn
        self.trace = _Trace(self)

    def start(self) -> None:
        self.trace.last = None
        self.conn.set_trace_callback(self.trace)

    def stop(self) -> None:
        self.conn.set_trace_callback(None)

    def boundary(self) -> None:
        self.trace.last = None


def held_connections(db: Any) -> list[Any]:
    """The SQLAlchemy connections a ``SessionDB`` keeps checked out between calls."""
    idle = getattr(db, "_idle", None) or {}
    return [c for stack in idle.values() for c in stack if not getattr(c, "closed", True)]


class EngineMeter(Meter):
    """The library: SQLAlchemy events on its engine (+ the sqlite3 trace on SQLite)."""

    def __init__(self, engine: Any, held: Callable[[], list[Any]] = lambda: [],
                 settle: Callable[[], object] = lambda: None) -> None:
        """``settle``: waits until no other thread of the store (its upkeep) runs a
        statement: a trace callback set or cleared on a connection in use by another thread
        deadlocks (the setter holds the GIL waiting for the connection's mutex, the user
        holds the mutex waiting for the GIL to call the callback)."""
        super().__init__()
        self.engine = engine
        self.held = held
        self.settle = settle
        self.sqlite = engine.dialect.name == "sqlite"
        self.unit = "statements" if self.sqlite else "round trips"
        self.sa = 0
        self.trace = _Trace(self)
        self._traced: list[sqlite3.Connection] = []
        self._listeners: list[tuple[str, Callable[..., Any]]] = []

    # -- events
    def _before(self, conn: Any, _cursor: Any, _stmt: str, _params: Any, _ctx: Any, _many: bool) -> None:
        self.sa += 1  # type: ignore[operator]
        if self.sqlite:
            return  # the trace callback counts every statement, this one included
        driver = conn.connection.driver_connection
        if not driver.autocommit and driver.info.transaction_status == _IDLE:
            self.count += 1  # psycopg sends BEGIN first
        self.count += 1

    def _end(self, conn: Any) -> None:
        if self.sqlite:
            return
        driver = conn.connection.driver_connection
        if driver.info.transaction_status != _IDLE:
            self.count += 1  # psycopg sends COMMIT / ROLLBACK (autocommit or not)

    def _install(self, dbapi_conn: Any) -> None:
        if isinstance(dbapi_conn, sqlite3.Connection) and dbapi_conn not in self._traced:
            dbapi_conn.set_trace_callback(self.trace)
            self._traced.append(dbapi_conn)

    def _checkout(self, dbapi_conn: Any, _rec: Any, _proxy: Any) -> None:
        self._install(dbapi_conn)

    def start(self) -> None:
        from sqlalchemy import event

        self.trace.last = None
        self._listeners = [("before_cursor_execute", self._before), ("commit", self._end), ("rollback", self._end)]
        if self.sqlite:
            self._listeners.append(("checkout", self._checkout))
        for name, fn in self._listeners:
            event.listen(self.engine, name, fn)
        if self.sqlite:
            self.settle()
            for conn in self.held():
                with contextlib.suppress(Exception):
                    self._install(conn.connection.driver_connection)

    def stop(self) -> None:
        from sqlalchemy import event

        if self._traced:
            self.settle()
        for name, fn in self._listeners:
            with contextlib.suppress(Exception):
                event.remove(self.engine, name, fn)
        self._listeners = []
        for dbapi_conn in self._traced:
            with contextlib.suppress(Exception):
                dbapi_conn.set_trace_callback(None)
        self._traced = []

    def boundary(self) -> None:
        self.trace.last = None


class _CountingCursor:
    def __init__(self, cur: Any, meter: Meter) -> None:
        self._cur = cur
        self._meter = meter

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cur)

    def __enter__(self) -> _CountingCursor:
        self._cur.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._cur.__exit__(*exc)

    def execute(self, *a: Any, **k: Any) -> _CountingCursor:
        self._meter.count += 1
        self._cur.execute(*a, **k)
        return self

    def executemany(self, *a: Any, **k: Any) -> None:
        self._meter.count += 1  # psycopg pipelines the parameter sets
        self._cur.executemany(*a, **k)


class _CountingPgConnection:
    """Stands in for ``PgBaseline.conn`` during a probe."""

    def __init__(self, conn: Any, meter: Meter) -> None:
        self._conn = conn
        self._meter = meter

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def execute(self, *a: Any, **k: Any) -> Any:
        self._meter.count += 1
        return self._conn.execute(*a, **k)

    def cursor(self, *a: Any, **k: Any) -> _CountingCursor:
        return _CountingCursor(self._conn.cursor(*a, **k), self._meter)

    @contextlib.contextmanager
    def transaction(self, *a: Any, **k: Any) -> Iterator[Any]:
        self._meter.count += 1  # BEGIN (SAVEPOINT when nested)
        try:
            with self._conn.transaction(*a, **k) as tx:
                yield tx
        finally:
            self._meter.count += 1  # COMMIT / RELEASE / ROLLBACK


class PgFloorMeter(Meter):
    """The psycopg floor: its connection wrapped while started."""

    unit = "round trips"

    def __init__(self, base: Any) -> None:
        super().__init__()
        self.base = base
        self._real: Any = None

    def start(self) -> None:
        self._real = self.base.conn
        self.base.conn = _CountingPgConnection(self._real, self)

    def stop(self) -> None:
        if self._real is not None:
            self.base.conn = self._real
            self._real = None


def floor_meter(base: Any) -> Meter:
    conn = getattr(base, "conn", None)
    return SqliteMeter(conn) if isinstance(conn, sqlite3.Connection) else PgFloorMeter(base)


def calls_for(mean_s: float, budget_s: float = 0.5, lo: int = 3, hi: int = 30) -> int:
    """How many extra calls fit a probe budget (a slow call: one)."""
    if mean_s <= 0:
        return hi
    return max(1 if mean_s > 1.0 else lo, min(hi, int(budget_s / mean_s)))


def count_calls_for(cpu_calls: int, count_calls: int | None = None) -> int:
    """How many counted calls a probe makes after ``cpu_calls`` timed ones (unless given)."""
    return count_calls if count_calls is not None else max(1, min(5, cpu_calls))


@contextlib.contextmanager
def cpu_timed(out: dict[str, Any], calls: int) -> Iterator[None]:
    """This process's CPU over the ``calls`` calls made in the block, per call, into ``out``.

    With :func:`counted`, the bookkeeping of :func:`probe` and of bench/aio_bench.py's
    awaited probe: only the calls themselves differ (plain or awaited)."""
    gc.collect()
    c0 = time.process_time_ns()
    yield
    out["client_cpu_ms_per_call"] = (time.process_time_ns() - c0) / 1e6 / calls
    out["cpu_calls"] = calls


@contextlib.contextmanager
def counted(meter: Meter, out: dict[str, Any], calls: int) -> Iterator[None]:
    """``meter`` attached around the ``calls`` calls made in the block; statements per call into ``out``."""
    s0, sa0 = meter.count, meter.sa
    meter.start()
    try:
        yield
    finally:
        meter.stop()
    out["stmts_per_call"] = (meter.count - s0) / calls
    if meter.sa is not None and sa0 is not None:
        out["stmts_sa_per_call"] = (meter.sa - sa0) / calls
    out.update(count_calls=calls, stmts_unit=meter.unit)


def probe(fn: Callable[[], Any], meter: Meter | None, cpu_calls: int, count_calls: int | None = None) -> dict[str, Any]:
    """Client CPU per call over ``cpu_calls`` plain calls, then statements per call over
    ``count_calls`` calls with ``meter`` attached. ``cpu_calls == 1`` (a slow call): one
    call does both."""
    out: dict[str, Any] = {}
    if cpu_calls == 1 and meter is not None:
        gc.collect()
        c0, s0, sa0 = time.process_time_ns(), meter.count, meter.sa
        meter.start()
        try:
            fn()
        finally:
            meter.stop()
        out["client_cpu_ms_per_call"] = (time.process_time_ns() - c0) / 1e6
        out["stmts_per_call"] = float(meter.count - s0)
        if meter.sa is not None and sa0 is not None:
            out["stmts_sa_per_call"] = float(meter.sa - sa0)
        out.update(cpu_calls=1, count_calls=1, stmts_unit=meter.unit)
        return out
    with cpu_timed(out, cpu_calls):
        for _ in range(cpu_calls):
            fn()
    if meter is None:
        return out
    n = count_calls_for(cpu_calls, count_calls)
    with counted(meter, out, n):
        for _ in range(n):
            meter.boundary()
            fn()
    return out


def merge(probes: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean of several operations' probes (a group line)."""
    probes = [p for p in probes if p]
    if not probes:
        return {}
    out: dict[str, Any] = {}
    for key in ("client_cpu_ms_per_call", "stmts_per_call", "stmts_sa_per_call"):
        vals = [p[key] for p in probes if key in p]
        if vals:
            out[key] = sum(vals) / len(vals)
    if "stmts_unit" in probes[0]:
        out["stmts_unit"] = probes[0]["stmts_unit"]
    return out


def fmt(p: dict[str, Any] | None) -> str:
    """``'  3 st  cpu 1.234 ms'`` (st: statements on SQLite, round trips on PostgreSQL)."""
    if not p:
        return ""
    st = p.get("stmts_per_call")
    sts = "     " if st is None else (f"{st:5.0f}" if float(st).is_integer() else f"{st:5.1f}")
    return f"  {sts} st  cpu {p['client_cpu_ms_per_call']:8.3f} ms"
