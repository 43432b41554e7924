"""The PostgreSQL append on the driver's cursor (``PostgreSQLDialect._append_on_driver``):
the statement SQLAlchemy would send, sent by psycopg directly when nothing listens to
SQLAlchemy's statement events, with the same rows, counters, ids, typed errors, lock
budget, tenant schema and dead-connection handling as SQLAlchemy's own path.

Each comparison runs both paths in one test: a ``before_cursor_execute`` listener on the
store's engine sends every append back through SQLAlchemy (so meters and tracers keep
seeing each statement).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy import event, text
from sqlalchemy.engine import make_url

from hermes_store import SessionDB, errors, facade
from hermes_store.dialects import postgresql as pg_dialect
from hermes_store.engine import create_engine
from hermes_store.repositories import MessageRepository

#: One of each kind of message an agent turn writes, NUL and CJK included.
MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "fix the failing test, 请看 tests/test_foo.py"},
    {"role": "assistant", "content": "Looking.", "finish_reason": "tool_calls", "token_count": 42,
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}},
                    {"id": "c2", "type": "function", "function": {"name": "grep", "arguments": "{}"}}]},
    {"role": "tool", "content": "line one\x00line two", "tool_call_id": "c1", "tool_name": "read"},
    {"role": "assistant", "content": [{"type": "text", "text": "done"}], "reasoning": "because",
     "display_kind": "note", "display_metadata": {"k": 1}},
]
#: Columns that differ between two otherwise identical appends (display_order follows
#: the id sequence).
_OWN = ("id", "session_id", "timestamp", "display_order")


def _to_psycopg(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _listen(store: SessionDB) -> tuple[list[str], Callable[[], None]]:
    """Every statement the store's engine sends through SQLAlchemy while attached."""
    seen: list[str] = []

    def hook(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        seen.append(statement)

    event.listen(store.engine, "before_cursor_execute", hook)
    return seen, lambda: event.remove(store.engine, "before_cursor_execute", hook)


def _rows(store: SessionDB, sid: str) -> list[dict[str, Any]]:
    rows = store.get_messages(sid, include_inactive=True)
    return [{k: v for k, v in r.items() if k not in _OWN} for r in rows]


@pytest.fixture
def pg(pg_database: str) -> Iterator[SessionDB]:
    store = SessionDB(pg_database)
    yield store
    store.close()


def test_driver_path_writes_what_sqlalchemy_writes(pg: SessionDB) -> None:
    pg.create_session("driver", "cli")
    pg.create_session("sqlalchemy", "cli")
    pg_dialect._RENDERED.clear()
    driver_ids = [pg.append_message("driver", **m) for m in MESSAGES]
    assert pg_dialect._RENDERED, "the appends went to the driver's cursor"
    seen, detach = _listen(pg)
    try:
        sa_ids = [pg.append_message("sqlalchemy", **m) for m in MESSAGES]
    finally:
        detach()
    assert len([s for s in seen if "INSERT INTO" in s]) == len(MESSAGES)  # a listener sees each append
    assert driver_ids == sorted(driver_ids) and sa_ids == sorted(sa_ids) and driver_ids[-1] < sa_ids[0]
    assert _rows(pg, "driver") == _rows(pg, "sqlalchemy")
    assert [r["content"] for r in _rows(pg, "driver")][2] == "line one\x00line two"  # NUL kept
    for sid, ids in (("driver", driver_ids), ("sqlalchemy", sa_ids)):
        got = pg.get_session(sid)
        assert (got["message_count"], got["tool_call_count"]) == (4, 2)
        assert [m["id"] for m in pg.get_messages(sid)] == ids


def test_driver_path_refusals_and_driver_errors_are_typed(pg: SessionDB) -> None:
    """Unknown session, a target compression closed, a value out of range: the same typed
    errors on both paths, nothing written, counters untouched."""
    pg.create_session("closed", "cli")
    pg.create_session("open", "cli")
    with pg.engine.begin() as conn:
        conn.execute(text("UPDATE sessions SET end_reason = 'compression' WHERE id = 'closed'"))

    def failures() -> list[type[BaseException]]:
        kinds = []
        for call in (lambda: pg.append_message("nobody", "user", "x"),
                     lambda: pg.append_message("closed", "user", "x"),
                     lambda: pg.append_message("open", "user", "x", token_count=2 ** 70)):
            with pytest.raises(errors.HermesStoreError) as info:
                call()
            kinds.append(type(info.value))
        return kinds

    on_driver = failures()
    seen, detach = _listen(pg)
    try:
        through_sqlalchemy = failures()
    finally:
        detach()
    assert seen  # the second round went through SQLAlchemy
    assert on_driver == through_sqlalchemy == [
        errors.UnknownSessionError, errors.CompressionSessionClosedError, errors.InvalidInputError]
    assert pg.message_count() == 0
    assert pg.get_session("open")["message_count"] == 0
    assert pg.append_message("open", "user", "still fine") > 0  # the kept connection still works
    assert pg.get_session("open")["message_count"] == 1


def test_driver_path_names_the_tenant_schema(pg_database: str) -> None:
    with SessionDB(pg_database, schema="tenant_a") as a, SessionDB(pg_database, schema="tenant_b") as b:
        for store, n in ((a, 3), (b, 2)):
            store.create_session("s", "cli")
            for i in range(n):
                store.append_message("s", "user", f"m{i}")
        assert (a.get_session("s")["message_count"], b.get_session("s")["message_count"]) == (3, 2)
    with psycopg.connect(_to_psycopg(pg_database)) as conn:
        counts = dict(conn.execute(
            "SELECT 'a', count(*) FROM tenant_a.messages UNION ALL SELECT 'b', count(*) FROM tenant_b.messages"
        ).fetchall())
        public = conn.execute("SELECT to_regclass('public.messages')").fetchone()
    assert counts == {"a": 3, "b": 2}
    assert public == (None,)  # nothing reached the default schema


def test_driver_path_in_a_host_transaction_is_rolled_back_with_it(pg_database: str) -> None:
    """Not in driver autocommit: the statement goes inside the host's transaction, which
    SQLAlchemy ends (a rollback leaves nothing, a commit keeps the row)."""
    with SessionDB(pg_database) as store:
        store.create_session("s", "cli")
    engine = create_engine(pg_database)
    try:
        for keep in (False, True):
            with engine.connect() as conn:
                MessageRepository(conn).append("s", "user", f"kept={keep}")
                assert conn.in_transaction()
                conn.commit() if keep else conn.rollback()
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT content FROM messages WHERE session_id = 's'")).scalars().all()
            count = conn.execute(text("SELECT message_count FROM sessions WHERE id = 's'")).scalar()
    finally:
        engine.dispose()
    assert rows == ["kept=True"] and count == 1


def test_driver_path_turn_lease_append(pg: SessionDB) -> None:
    """A turn-lease append runs in a write transaction (guards first): same row and counters."""
    pg.create_session("s", "cli")
    with pytest.raises(errors.SessionTurnLeaseLostError):
        pg.append_message("s", "user", "not held", turn_lease_holder="turn-1")
    assert pg.try_acquire_session_turn_lease("s", "turn-1")
    mid = pg.append_message("s", "user", "leased", turn_lease_holder="turn-1")
    assert [m["id"] for m in pg.get_messages("s")] == [mid]
    assert pg.get_session("s")["message_count"] == 1


def test_driver_path_keeps_the_lock_budget(pooled_database: tuple[str, str], monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    """Another transaction holding the session row: the append waits for at most its
    budget, then DatabaseLockedError; released, it writes once."""
    direct, pooled = pooled_database
    with SessionDB(pooled) as store:
        store.create_session("s", "cli")
        store.append_message("s", "user", "warm")
        monkeypatch.setattr(facade, "TRANSCRIPT_BUDGET_S", 0.4)
        holder = psycopg.connect(_to_psycopg(direct))
        try:
            holder.execute("SELECT 1 FROM sessions WHERE id = 's' FOR UPDATE")
            with pytest.raises(errors.DatabaseLockedError):
                store.append_message("s", "user", "blocked")
        finally:
            holder.rollback()
            holder.close()
        store.append_message("s", "user", "after")
        assert [m["content"] for m in store.get_messages("s")] == ["warm", "after"]
        assert store.get_session("s")["message_count"] == 2


def _writer_pid(store: SessionDB) -> int:
    """The server process behind the store's kept write connection."""
    (conn,) = store._idle[True]
    return int(conn.connection.driver_connection.info.backend_pid)


@pytest.mark.pg_direct
def test_driver_path_replaces_a_dead_kept_connection(pg_database: str) -> None:
    """The server ended the kept write connection: the append's failure invalidates it,
    and the append is sent once more on a fresh one (written once)."""
    with SessionDB(pg_database) as store:
        store.create_session("s", "cli")
        store.append_message("s", "user", "before")
        dead = _writer_pid(store)
        with psycopg.connect(_to_psycopg(pg_database), autocommit=True) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s)", (dead,)).fetchone() == (True,)
        store.append_message("s", "user", "after")
        assert _writer_pid(store) != dead
        assert [m["content"] for m in store.get_messages("s")] == ["before", "after"]
        assert store.get_session("s")["message_count"] == 2


@pytest.mark.pg_direct
def test_driver_path_concurrent_appends_keep_counts_exact(pg_database: str) -> None:
    """Threads of one store appending to shared sessions: every row there, counters exact."""
    with SessionDB(pg_database) as store:
        for sid in ("a", "b"):
            store.create_session(sid, "cli")
        failures: list[BaseException] = []

        def work(me: int) -> None:
            try:
                for i in range(40):
                    store.append_message("ab"[i % 2], **MESSAGES[(me + i) % len(MESSAGES)])
            except BaseException as exc:  # reported below
                failures.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        calls = sum(len(MESSAGES[(me + i) % 4].get("tool_calls") or []) for me in range(4) for i in range(40))
        got = [store.get_session(s) for s in ("a", "b")]
        assert sum(g["message_count"] for g in got) == 160 == store.message_count()
        assert sum(g["tool_call_count"] for g in got) == calls


def test_driver_path_skipped_for_a_listened_engine_and_echo(pg_database: str) -> None:
    """A plain SQLAlchemy engine with ``echo``: statements are logged, so they go through
    SQLAlchemy (the driver path is for connections nobody watches)."""
    with SessionDB(pg_database) as store:
        store.create_session("s", "cli")
    engine = sa_create_engine(pg_database, echo=True)
    try:
        with engine.connect() as conn:
            assert pg_dialect._driver_path(conn) is None
        quiet = sa_create_engine(pg_database)
        try:
            with quiet.connect() as conn:
                conn.execute(text("SELECT 1"))
                assert pg_dialect._driver_path(conn) is not None  # in SQLAlchemy's transaction
                conn.rollback()
                assert pg_dialect._driver_path(conn) is None  # psycopg would open one on its own
        finally:
            quiet.dispose()
    finally:
        engine.dispose()


def test_has_table_answers_as_the_inspector(pg_database: str) -> None:
    """The upkeep's table test (one plain statement) agrees with SQLAlchemy's Inspector:
    tables and views of the schema asked about, visible ones without a schema, never an
    index or a sequence, never another schema's table."""
    from sqlalchemy import inspect

    engine = sa_create_engine(pg_database)
    tenant = create_engine(pg_database, schema="tenant_t")
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE SCHEMA tenant_t"))
            conn.execute(text("CREATE TABLE tenant_t.only_there (x int)"))
            conn.execute(text("CREATE TABLE plain (x int)"))
            conn.execute(text("CREATE INDEX plain_x ON plain (x)"))
            conn.execute(text("CREATE VIEW plain_view AS SELECT x FROM plain"))
            conn.execute(text("CREATE MATERIALIZED VIEW plain_mat AS SELECT x FROM plain"))
            conn.execute(text("CREATE SEQUENCE plain_seq"))
        names = ("plain", "plain_x", "plain_view", "plain_mat", "plain_seq", "only_there", "missing", "pg_class")
        for eng, schema, want in ((engine, None, [True, False, True, True, False, False, False, False]),
                                  (tenant, "tenant_t", [False, False, False, False, False, True, False, False])):
            with eng.connect() as conn:
                ours = [pg_dialect.DIALECT.has_table(conn, n) for n in names]
                theirs = [inspect(conn).has_table(n, schema=schema) for n in names]
            assert ours == theirs == want
    finally:
        tenant.dispose()
        engine.dispose()


def test_driver_path_needs_named_parameters(pg_database: str) -> None:
    """An engine told to use positional parameters renders its statements for them:
    its appends stay on SQLAlchemy's path, with the same outcome."""
    with SessionDB(pg_database) as store:
        store.create_session("s", "cli")
    engine = sa_create_engine(pg_database, paramstyle="format")
    try:
        with engine.connect() as conn:
            assert pg_dialect._driver_path(conn) is None
            mid = MessageRepository(conn).append("s", "user", "positional")
            conn.commit()
        with engine.connect() as conn:
            row = conn.execute(text("SELECT id, content FROM messages")).one()
            count = conn.execute(text("SELECT message_count FROM sessions WHERE id = 's'")).scalar()
    finally:
        engine.dispose()
    assert tuple(row) == (mid, "positional") and count == 1


@pytest.mark.parametrize("budgeted", [False, True])
@pytest.mark.parametrize("tenant", [None, "tenant x"])
def test_append_text_is_sqlalchemys_own(pg_database: str, budgeted: bool, tenant: str | None) -> None:
    """Each column set's statement, assembled from the checked template, is the text
    SQLAlchemy compiles for it (tenant schema written in)."""
    engine = create_engine(pg_database)
    try:
        with engine.connect():
            pass  # the dialect learns the server's version
        translate = {None: tenant} if tenant else None
        key = (type(engine.dialect), budgeted, tuple(translate.items()) if translate else None)
        template = pg_dialect._append_template(engine.dialect, budgeted, *key[:1], key[2], translate)
        assert template is not None
        columns = [c.name for c in pg_dialect._MESSAGES.c if c.name != "id"]
        for width in (1, 4, 9, len(columns)):
            for start in range(0, len(columns) - width + 1, 5):
                names = ("session_id", *[n for n in columns[start:start + width] if n != "session_id"])
                expected = pg_dialect._append_stmt(names, budgeted).compile(
                    dialect=engine.dialect, schema_translate_map=translate, render_schema_translate=bool(tenant))
                assert template.render(names) == expected.string
                if tenant:
                    assert f'"{tenant}".messages' in expected.string
    finally:
        engine.dispose()
