"""Async engines set up like :func:`hermes_store.engine.create_engine`.

The same dialect modules configure them: their ``connect`` and ``begin`` hooks go on
the AsyncEngine's ``sync_engine``, where SQLAlchemy runs them (on the caller's
greenlet), so an async engine gets the same PRAGMAs, the same real BEGIN, foreign
keys, typed errors and pooler-safe PostgreSQL defaults as a sync one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import os
import re
import sqlite3
import sys
import threading
from typing import Any, TypeVar, cast
from collections.abc import Callable, Sequence

import aiosqlite
import greenlet
from sqlalchemy.dialects.sqlite.aiosqlite import (
    AsyncAdapt_aiosqlite_connection,
    AsyncAdapt_aiosqlite_cursor,
    AsyncAdapt_aiosqlite_dbapi,
    SQLiteDialect_aiosqlite,
)
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.ext.asyncio import create_async_engine as _sa_create_async_engine
from sqlalchemy.util import EMPTY_DICT, await_only

from .. import dialects, encryption, errors
from ..engine import DEFAULT_BUSY_TIMEOUT_MS, install_error_translation, keyed_url, to_url, with_schema
from ..targets import refuse_sync

T = TypeVar("T")

# --------------------------------------------------------------------------- aiosqlite, one hop a statement
#
# aiosqlite runs every call on its connection's own thread: a queue put, a wake-up of
# that thread, and a wake-up of the loop when it is done (a "hop"). SQLAlchemy's adapter
# makes four of them per statement (open a cursor, execute, fetch the rows, close the
# cursor), so an append of four statements cost sixteen hops, most of the async API's
# extra time on SQLite. The cursor below does all four in one hop, on the driver's
# thread, and keeps what the DB-API cursor would answer afterwards (rows, description,
# rowcount, lastrowid) as plain values. A ``BEGIN`` travels with the hop that follows it
# (:class:`BeginWithNext`): every transaction costs one hop less, and a transaction
# that ends before running anything costs none.
#
# A whole call goes further (:meth:`OneHopConnection.run_whole`): sync code driving the
# connection through SQLAlchemy (a store's read, or a batch of appends with its COMMIT)
# runs on the driver's thread itself, where the adapter calls sqlite3 directly, as a
# sync engine would: one hop per call, however many statements it sends.

#: A transaction's opening statement, as our begin hook and SQLAlchemy send it.
_BEGIN = re.compile(r"\s*BEGIN(?:\s+(?:DEFERRED|IMMEDIATE|EXCLUSIVE))?(?:\s+TRANSACTION)?\s*;?\s*", re.IGNORECASE)


class BeginWithNext(aiosqlite.Connection):
    """aiosqlite's connection, where a ``BEGIN`` waits for the next call to its thread
    and runs there first, in the same hop. Whatever that call is (a statement, a
    COMMIT, a cursor), SQLite sees the same order as before; a failed BEGIN fails that
    call, before it runs. :attr:`in_transaction` counts the waiting BEGIN."""

    #: The ``BEGIN`` waiting for the next hop.
    _begin_next: str | None = None
    #: Calls handed to the driver's thread (counted on the loop) and ended there (counted
    #: on that thread): one writer each, so equal means the thread is idle for us.
    _sent = 0
    _ended = 0
    #: The loop's thread while it drives sqlite3 itself (:meth:`OneHopConnection.run_whole`, ``here``).
    _here: int | None = None
    #: The connection's busy timeout (ms), read at its first write run on the loop's thread.
    _busy_ms: int | None = None
    #: Writes run on the loop's thread so far (see :data:`YIELD_EVERY`).
    _here_runs = 0

    @property
    def in_transaction(self) -> bool:
        return self._begin_next is not None or bool(self._conn.in_transaction)

    def begin_with_next(self, sql: str) -> None:
        self._begin_next = sql

    def drop_begin(self) -> bool:
        """Forget a waiting BEGIN (its transaction ended before running anything); True if there was one."""
        waiting, self._begin_next = self._begin_next, None
        return waiting is not None

    def on_own_thread(self) -> bool:
        """Whether the caller drives sqlite3 itself: on this connection's thread (inside
        :meth:`OneHopConnection.run_whole`), or on the loop's while it runs a short write there."""
        me = threading.get_ident()
        return me == self._thread.ident or me == self._here

    def idle(self) -> bool:
        """Whether nothing of ours is queued on, or running on, the driver's thread."""
        return self._sent == self._ended and bool(self._running and self._connection)

    def _ending(self, call: Callable[[], T]) -> Callable[[], T]:
        """``call``, counted as sent now and as ended when the driver's thread is done with it."""
        self._sent += 1

        def counted() -> T:
            try:
                return call()
            finally:
                self._ended += 1

        counted.__name__ = getattr(call, "__name__", counted.__name__)  # what it runs, for a reader of hops
        return counted

    def begin_now(self) -> None:
        """On the driver's thread: run the waiting BEGIN, if any, before what follows."""
        begin, self._begin_next = self._begin_next, None
        if begin is not None:
            self._conn.execute(begin)

    async def _execute(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        begin, self._begin_next = self._begin_next, None
        if begin is None:
            return await super()._execute(self._ending(functools.partial(fn, *args, **kwargs)))  # type: ignore[no-untyped-call]
        conn = self._conn

        def begin_then() -> Any:
            conn.execute(begin)
            return fn(*args, **kwargs)

        return await super()._execute(self._ending(begin_then))  # type: ignore[no-untyped-call]

    def run_here(self, fn: Callable[..., T], *args: Any) -> T | _NotHere:
        """``fn(*args)``, a short write, run by the caller's (the loop's) thread on sqlite3
        itself, while the driver's thread is idle (:meth:`idle`). It must not wait for
        a lock: the busy timeout is 0 meanwhile, so SQLite fails at once instead of
        sleeping; and WAL commits at synchronous=NORMAL do not fsync. (A COMMIT may run
        SQLite's autocheckpoint when the WAL passes 1,000 pages, which the store's upkeep,
        every ``facade.CHECKPOINT_EVERY`` writes, keeps rare.) :data:`NOT_HERE`, the
        waiting BEGIN still waiting, when another connection holds the file's write
        lock: the caller hops instead, where SQLite's busy handler may wait without
        holding up the loop."""
        conn = self._conn
        if self._busy_ms is None:
            self._busy_ms = int(conn.execute("PRAGMA busy_timeout").fetchone()[0])
        conn.execute("PRAGMA busy_timeout = 0")  # fail at once on a lock held elsewhere
        try:
            begin = self._begin_next
            if begin is not None:
                try:
                    conn.execute(begin)
                except _begin_errors():
                    return NOT_HERE  # locked elsewhere (or another failure, which the hop raises typed)
                self._begin_next = None
            self._here = threading.get_ident()  # the adapter calls sqlite3 directly, as on the driver's thread
            try:
                return fn(*args)
            finally:
                self._here = None
        finally:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")  # the connection's own wait again


def _begin_errors() -> tuple[type[BaseException], ...]:
    """A BEGIN refused on a connection of sqlite3's or SQLCipher's (a lock held elsewhere)."""
    return (sqlite3.OperationalError, *encryption.driver_errors())


class _NotHere:
    """:meth:`BeginWithNext.run_here`'s answer when the write must hop instead."""


NOT_HERE = _NotHere()


def _statement_on_thread(conn: sqlite3.Connection, operation: str, parameters: Any, many: bool
                         ) -> tuple[Any, list[Any] | None, int, int | None]:
    """One statement, start to end, on aiosqlite's thread: (description, rows, rowcount, lastrowid)."""
    cursor = conn.cursor()
    try:
        if many:
            cursor.executemany(operation, parameters)
        elif parameters is None:
            cursor.execute(operation)
        else:
            cursor.execute(operation, parameters)
        description = cursor.description
        rows = cursor.fetchall() if description else None
        return description, rows, cursor.rowcount, cursor.lastrowid
    finally:
        cursor.close()


class OneHopCursor(AsyncAdapt_aiosqlite_cursor):
    """SQLAlchemy's aiosqlite cursor with each statement one hop to the driver's thread
    (see above). Server-side cursors stay SQLAlchemy's own."""

    __slots__ = ("_description", "_lastrowid", "_rowcount")

    def __init__(self, adapt_connection: AsyncAdapt_aiosqlite_connection) -> None:
        self._adapt_connection = adapt_connection
        self._connection = adapt_connection._connection
        self._cursor = None  # type: ignore[assignment]  # no driver cursor is kept between hops
        self._soft_closed_memoized = EMPTY_DICT
        self._rows = collections.deque()
        self._description: Any = None
        self._rowcount = -1
        self._lastrowid: int | None = None

    @property
    def description(self) -> Any:
        return self._description

    @property
    def rowcount(self) -> int:
        return self._rowcount

    @property
    def lastrowid(self) -> int:
        return self._lastrowid  # type: ignore[return-value]

    @property
    def arraysize(self) -> int:
        return 1

    @arraysize.setter
    def arraysize(self, value: int) -> None:
        pass  # every row is fetched in the statement's hop

    async def _async_soft_close(self) -> None:
        return None  # nothing held on the driver's thread

    def close(self) -> None:
        self._rows.clear()

    def execute(self, operation: Any, parameters: Any = None) -> Any:
        try:
            if not self._deferred(operation, parameters, False):
                self._statement(operation, parameters, False)
        except Exception as error:
            self._adapt_connection._handle_exception(error)

    def executemany(self, operation: Any, seq_of_parameters: Sequence[Any]) -> Any:
        try:
            self._statement(operation, seq_of_parameters, True)
        except Exception as error:
            self._adapt_connection._handle_exception(error)

    def _deferred(self, operation: Any, parameters: Any, many: bool) -> bool:
        """A ``BEGIN`` outside a transaction waits for the next hop (see BeginWithNext)."""
        driver = self._connection
        if (not many and not parameters and isinstance(driver, BeginWithNext) and isinstance(operation, str)
                and not driver.in_transaction and _BEGIN.fullmatch(operation)):
            driver.begin_with_next(operation)
            self._description, self._rows, self._rowcount, self._lastrowid = None, collections.deque(), -1, None
            return True
        return False

    def _statement(self, operation: Any, parameters: Any, many: bool) -> None:
        driver = self._connection
        if isinstance(driver, BeginWithNext) and driver.on_own_thread():  # inside run_whole: sqlite3 itself
            driver.begin_now()
            outcome = _statement_on_thread(driver._conn, operation, parameters, many)
        else:
            outcome = await_only(self._hop(operation, parameters, many))
        description, rows, self._rowcount, self._lastrowid = outcome
        self._description = description
        self._rows = collections.deque(rows) if rows else collections.deque()

    async def _hop(self, operation: Any, parameters: Any, many: bool
                   ) -> tuple[Any, list[Any] | None, int, int | None]:
        driver = self._connection
        async with self._adapt_connection._execute_mutex:
            outcome: tuple[Any, list[Any] | None, int, int | None] = await driver._execute(
                _statement_on_thread, driver._conn, operation, parameters, many)
            return outcome

    def nextset(self) -> None:
        return None  # sqlite3 has one result set per statement


class OneHopConnection(AsyncAdapt_aiosqlite_connection):
    """SQLAlchemy's aiosqlite connection adapter with :class:`OneHopCursor`, over
    :class:`BeginWithNext`."""

    __slots__ = ()
    _cursor_cls = OneHopCursor  # type: ignore[assignment]  # a subclass; mypy reads its __init__ as narrower

    def commit(self) -> None:
        driver = self._connection
        if driver.drop_begin():  # nothing ran: nothing to commit
            return
        if driver.on_own_thread():
            self._here(driver._conn.commit)
        else:
            super().commit()

    def rollback(self) -> None:
        driver = self._connection
        if driver.drop_begin():
            return
        if driver.on_own_thread():
            self._here(driver._conn.rollback)
        else:
            super().rollback()

    def _here(self, call: Callable[[], Any]) -> None:
        """``call`` on the driver's thread, its error raised as the adapter raises it."""
        try:
            call()
        except Exception as error:
            self._handle_exception(error)

    def close(self) -> None:
        self._connection.drop_begin()
        super().close()

    def run_on_driver(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(sqlite3_connection, *args)`` in one hop on the driver's thread (a waiting
        BEGIN first): a dialect's raw path of several statements (an append) pays one
        hop, not one per statement. The driver's errors come back as they are."""
        driver = self._connection
        if driver.on_own_thread():  # inside run_whole
            driver.begin_now()
            return fn(driver._conn, *args)

        async def hop() -> T:
            async with self._execute_mutex:
                result: T = await driver._execute(fn, driver._conn, *args)
                return result

        return await_only(hop())

    def run_whole(self, fn: Callable[..., T], *args: Any, here: bool = False) -> T:
        """``fn(*args)``, sync code driving this connection (through SQLAlchemy or
        :meth:`run_on_driver`), run on the driver's thread in one hop: each of its
        statements, its COMMIT or ROLLBACK, calls sqlite3 there directly. ``fn`` must
        not await anything (it has no event loop): it is a sync engine's work, moved.

        ``here``: ``fn`` is a short write (a batch of appends), run on the loop's own
        thread when it can start at once (:data:`RUN_SHORT_WRITES_HERE`): the hop's two
        thread wake-ups cost about as much as the write itself, and a loop blocked for a
        hop's worth of time is no worse off. When another connection holds the write
        lock (:meth:`BeginWithNext.run_here`) it hops, as any other call.

        Called from the loop's greenlet. A cancelled caller waits for ``fn`` to end
        before its cancellation goes on: the loop must not touch the connection (a
        rollback) while the driver's thread still drives it."""
        driver = cast(BeginWithNext, self._connection)
        if driver.on_own_thread():
            return fn(*args)

        if not (driver._running and driver._connection):
            self._handle_exception(ValueError("Connection closed"))  # sqlite3's OperationalError, as a statement's

        if here and RUN_SHORT_WRITES_HERE and not self._execute_mutex.locked() and driver.idle():
            done = driver.run_here(fn, *args)
            if not isinstance(done, _NotHere):
                driver._here_runs += 1
                if driver._here_runs % YIELD_EVERY == 0:
                    # A turn of the loop, as a hop gives: other tasks (and the store's
                    # upkeep) run between the writes of a task writing in a tight loop.
                    await_only(asyncio.sleep(0))
                return done

        async def hop() -> T:
            async with self._execute_mutex:
                ended: list[bool] = []  # appended to on the driver's thread when fn is done (no lock needed)

                def whole_call() -> T:
                    try:
                        return fn(*args)
                    finally:
                        ended.append(True)

                try:
                    # aiosqlite's own hop, not BeginWithNext's: the first statement of ``fn``
                    # runs the waiting BEGIN (begin_now), so its failure is that statement's.
                    # Not shielded (a shield costs a loop turn per hop): see below.
                    result: T = await aiosqlite.Connection._execute(  # type: ignore[no-untyped-call]
                        driver, driver._ending(whole_call))
                    return result
                except asyncio.CancelledError:
                    while not ended:  # rare: polled, not signalled
                        with contextlib.suppress(asyncio.CancelledError):
                            await asyncio.sleep(_ENDING_POLL_S)
                    raise

        return await_only(hop())


#: Whether a short write may run on the loop's thread (:meth:`OneHopConnection.run_whole`):
#: not where commits wait for a full fsync (macOS, see ``dialects.sqlite.enable_wal``).
RUN_SHORT_WRITES_HERE = sys.platform != "darwin"
#: A write run on the loop's thread gives the loop a turn every this many (a hop gives one
#: every time): a task writing in a tight loop holds the loop for a few appends' time at
#: most, and a turn per write would cost about a tenth of the write.
YIELD_EVERY = 4
#: How often a cancelled :meth:`OneHopConnection.run_whole` looks whether its call ended.
_ENDING_POLL_S = 0.001


class OneHopAiosqlite(AsyncAdapt_aiosqlite_dbapi):
    """The DB-API module an aiosqlite engine of ours is given (``module=``): SQLAlchemy's,
    with :class:`OneHopConnection` for connections."""

    def connect(self, *arg: Any, **kw: Any) -> OneHopConnection:
        # The loop's thread drives the connection itself for short writes, only while
        # the driver's thread is idle for it (OneHopConnection.run_whole).
        kw.setdefault("check_same_thread", False)
        adapted = super().connect(*arg, **kw)
        adapted.__class__ = OneHopConnection
        adapted._connection.__class__ = BeginWithNext  # type: ignore[assignment]  # aiosqlite's, extended
        return adapted  # type: ignore[return-value]


#: How long a refused connection's aiosqlite thread is waited for, at most (seconds).
_THREAD_END_S = 3.0


class KeyedAiosqlite(OneHopAiosqlite):
    """:class:`OneHopAiosqlite` for an encrypted file: aiosqlite's connection over SQLCipher's
    (``PRAGMA key`` first and the file read once, on the connection's own thread:
    :func:`hermes_store.encryption.connect`), and SQLCipher's error classes, so
    SQLAlchemy wraps and our hooks type its errors as they do sqlite3's."""

    def __init__(self, key: encryption.StoreKey) -> None:
        self._key = key
        super().__init__(aiosqlite, encryption.dbapi_module())

    def _init_dbapi_attributes(self) -> None:
        super()._init_dbapi_attributes()
        for name in ("DatabaseError", "Error", "IntegrityError", "NotSupportedError", "OperationalError",
                     "ProgrammingError", "sqlite_version", "sqlite_version_info"):
            setattr(self, name, getattr(self.sqlite, name))

    def connect(self, *arg: Any, **kw: Any) -> OneHopConnection:
        kw["async_creator_fn"] = self._keyed_connection
        return super().connect(*arg, **kw)

    def _keyed_connection(self, database: str, **kw: Any) -> Any:
        key = self._key

        def connector() -> Any:
            return encryption.connect(database, key, **kw)

        connection = aiosqlite.Connection(connector, 64)
        connection._thread.daemon = True  # as SQLAlchemy does for its own aiosqlite connections

        async def opened() -> aiosqlite.Connection:
            try:
                return await connection
            except BaseException:
                # A refused key: aiosqlite stops its thread without waiting for it; wait here,
                # so the thread never reports to a loop that has closed meanwhile.
                await asyncio.to_thread(connection._thread.join, _THREAD_END_S)
                raise

        return opened()


def _aiosqlite_module(url: URL) -> OneHopAiosqlite:
    if url.password:
        return KeyedAiosqlite(encryption.StoreKey(url.password))
    return OneHopAiosqlite(aiosqlite, sqlite3)


def async_url(target: str | os.PathLike[str] | URL) -> URL:
    """``target`` (a URL or a SQLite file path) with an asyncio driver: ``sqlite://``
    and a path become ``sqlite+aiosqlite://``, ``postgresql://`` (or ``+psycopg2``,
    ``+pg8000``) ``postgresql+asyncpg://``; ``postgresql+psycopg://`` stays (psycopg 3
    is async too). Another kind of database is an UnsupportedDatabaseError."""
    url = to_url(target)
    if dialects.find_for(url) is None:
        raise errors.UnsupportedDatabaseError(
            f"{dialects.backend_name(url)} databases are not supported; hermes_store.aio runs on "
            "sqlite+aiosqlite://, postgresql+asyncpg:// and postgresql+psycopg://"
        )
    return dialects.with_driver(url, asyncio=True)


def create_async_engine(
    target: str | os.PathLike[str] | URL,
    *,
    schema: str | None = None,
    foreign_keys: bool = True,
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    prepared_statements: bool = False,
    key: encryption.KeyLike | None = None,
    **kwargs: Any,
) -> AsyncEngine:
    """An AsyncEngine with our setup (see the module docstring); the arguments mean what
    they mean for :func:`hermes_store.engine.create_engine`, ``key`` included."""
    refuse_sync(target, "create_async_engine")
    if isinstance(target, AsyncEngine):
        raise errors.InvalidInputError("aio.create_async_engine takes a URL or a path; this is an engine already")
    url = keyed_url(async_url(with_schema(target, schema)), key)
    dialect = dialects.for_url(url)
    options = dialect.engine_kwargs(url, kwargs, prepared_statements=prepared_statements)
    if issubclass(url.get_dialect(), SQLiteDialect_aiosqlite):  # our DB-API adapter (see OneHopCursor)
        options.setdefault("module", _aiosqlite_module(url))
    engine = _sa_create_async_engine(encryption.url_without_key(url) if dialect.holders_on_this_machine else url,
                                     **options)
    if url.password and dialect.holders_on_this_machine:
        engine.sync_engine.url = url  # the key rides on the engine's URL, as create_engine's
    dialect.configure_engine(engine.sync_engine, foreign_keys=foreign_keys, busy_timeout_ms=busy_timeout_ms)
    install_error_translation(engine.sync_engine)
    return engine


class _Ended:
    """What a :class:`_Runner` hands back when its call ended: the result, or the error."""

    __slots__ = ("error", "value")

    def __init__(self, value: Any, error: BaseException | None) -> None:
        self.value = value
        self.error = error


class _Runner(greenlet.greenlet):  # type: ignore[misc]  # greenlet ships no types here
    """A greenlet that runs one sync call after another (SQLAlchemy's ``greenlet_spawn``
    makes a new one per call, the largest part of its cost). It carries the marker
    SQLAlchemy's ``await_only`` looks for, so statements inside a call await the driver
    as they do on SQLAlchemy's own greenlets. Between calls it waits, suspended, in its
    thread's pool."""

    __sqlalchemy_greenlet_provider__ = True

    def __init__(self) -> None:
        super().__init__(self._serve)

    def _serve(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        while True:
            try:
                ended = _Ended(fn(*args, **kwargs), None)
            except greenlet.GreenletExit:
                raise  # killed (collected while suspended in a call nobody awaits any more): it ends
            except BaseException as error:  # handed to the caller, raised there
                ended = _Ended(None, error)
            fn = args = kwargs = None  # type: ignore[assignment]  # nothing of this call kept meanwhile
            fn, args, kwargs = self.parent.switch(ended)  # the next call


#: Idle runners per thread (a greenlet can only be switched to in its own thread).
_RUNNERS = threading.local()
#: Idle runners a thread keeps (more tasks than this at once make new ones, dropped after).
_KEEP_RUNNERS = 24


async def run_sync(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run sync ``fn`` on a greenlet of this event loop: each statement it sends through an
    async engine awaits the driver, so the loop goes on serving other tasks meanwhile.

    As SQLAlchemy's ``greenlet_spawn``, on a greenlet reused from call to call: the
    driver's awaitables come out of the greenlet and are awaited here, their outcome
    (an error or a cancellation too) goes back in."""
    try:
        idle: list[_Runner] = _RUNNERS.idle
    except AttributeError:
        idle = _RUNNERS.idle = []
    runner = idle.pop() if idle else _Runner()
    here = greenlet.getcurrent()
    runner.parent = here
    runner.gr_context = here.gr_context  # the task's context variables, as greenlet_spawn does
    result: Any = runner.switch(fn, args, kwargs)
    while type(result) is not _Ended:
        if runner.dead:  # ended by GreenletExit: its value, as greenlet_spawn gives it
            return cast(T, result)
        try:
            value = await result
        except BaseException:
            result = runner.throw(*sys.exc_info())
        else:
            result = runner.switch(value)
    if len(idle) < _KEEP_RUNNERS:
        runner.gr_context = None  # an idle runner keeps no task's context variables alive
        idle.append(runner)
    if result.error is not None:
        error, result.error = result.error, None
        try:
            raise error
        finally:
            del error
    return cast(T, result.value)


async def run_interruptible(interrupt: Callable[[], bool], fn: Callable[..., T], *args: Any) -> T:
    """:func:`run_sync`, where cancelling the caller first stops the statement under way
    (``interrupt``, a dialect's :meth:`~hermes_store.dialects.base.Dialect.interrupter`)
    and lets ``fn`` end with the driver's error, so the connection stays usable and the
    rollback that follows runs at once. Where the driver cancels the statement at the
    server itself (``interrupt`` returns False), ``fn``'s task is cancelled instead."""
    inner = asyncio.ensure_future(run_sync(fn, *args))
    try:
        return await asyncio.shield(inner)
    except asyncio.CancelledError:
        if not inner.done() and not interrupt():
            inner.cancel()
        await asyncio.wait([inner])
        if not inner.cancelled():
            inner.exception()  # retrieved: the caller sees its own cancellation, not this
        raise


__all__ = ["async_url", "create_async_engine", "run_interruptible", "run_sync"]
