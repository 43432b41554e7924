"""Migrations on PostgreSQL: the baseline revision hs0002 builds the head schema with
types that hold what SQLite holds, hs0003 makes words split and fold as FTS5's
unicode61 does (and goes back exactly), ``downgrade base`` leaves nothing of ours, and
``alembic check`` / autogenerate are quiet. Every test gets its own fresh database, and
runs again (``[citus]``) in a fresh distributed schema of the Citus test cluster, where
every table is a single-shard table on a worker node (conftest ``pg_store``)."""

from __future__ import annotations

import contextlib
import io
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Engine, create_engine, insert, select, text
from sqlalchemy.engine import make_url

from hermes_store import migrations, paths
from hermes_store.keys import PG_DELEGATED_INDEX
from hermes_store.models import AgentSession, Message, metadata
from hermes_store.models.tables import BIG, DOUBLE
from hermes_store.repositories.search import SearchRepository

pytestmark = pytest.mark.on_citus

HEAD = paths.head()


def split_store(url: str) -> tuple[str, str | None]:
    """``(the URL without ?schema=, the schema it names or None)``."""
    parsed = make_url(url)
    schema = parsed.query.get("schema")
    base = parsed.difference_update_query(["schema"]).render_as_string(hide_password=False)
    return base, schema if isinstance(schema, str) else None


def store_schema(pg_store: str) -> str:
    """The schema the store at ``pg_store`` is in: its tenant, or a database's public."""
    return split_store(pg_store)[1] or "public"


@pytest.fixture
def pg_engine(pg_store: str) -> Iterator[Engine]:
    """A plain engine on the store's database whose connections work in its schema (their
    ``search_path`` starts with it), so the raw SQL below names no schema."""
    base, schema = split_store(pg_store)
    eng = create_engine(base, connect_args={"options": f"-csearch_path={schema},public"} if schema else {})
    yield eng
    eng.dispose()


def columns(engine: Engine) -> dict[tuple[str, str], dict]:
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT table_name, column_name, data_type, is_identity, is_generated, identity_generation "
            "FROM information_schema.columns WHERE table_schema = current_schema()"
        )).mappings().all()
    return {(r["table_name"], r["column_name"]): dict(r) for r in rows}


#: Our triggers: those on the tables of the current schema (the Citus cluster's database
#: holds other tests' tenants at the same time).
TRIGGERS = ("SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema() AND NOT t.tgisinternal")


def our_objects(engine: Engine) -> dict[str, set[str]]:
    """Every object in the current schema, from pg_catalog (tables, indexes, sequences,
    views, functions, triggers, types made by tables)."""
    with engine.connect() as conn:
        rels = conn.execute(text(
            "SELECT c.relkind, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema()"
        )).all()
        funcs = conn.execute(text(
            "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = current_schema() AND NOT EXISTS ("
            "  SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')"
        )).scalars().all()
        trigs = conn.execute(text(TRIGGERS)).scalars().all()
        types = conn.execute(text(
            "SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
            "WHERE n.nspname = current_schema() AND NOT EXISTS ("
            "  SELECT 1 FROM pg_depend d WHERE d.objid IN (t.oid, t.typelem) AND d.deptype = 'e')"
        )).scalars().all()
    out: dict[str, set[str]] = {"functions": set(funcs), "triggers": set(trigs), "types": set(types)}
    for kind, name in rels:
        out.setdefault(f"relkind_{kind}", set()).add(name)
    return out


# ------------------------------------------------------------------ schema at head


def test_upgrade_head_builds_every_table_with_exact_types(pg_store: str, pg_engine: Engine) -> None:
    assert migrations.current(pg_store) is None
    assert migrations.upgrade(pg_store) == HEAD
    assert {"hs0002", "hs0003"} <= set(paths.revision_order())
    assert migrations.current(pg_store) == HEAD
    cols = columns(pg_engine)
    tables = {t for t, _c in cols}
    assert tables == set(metadata.tables) | {migrations.VERSION_TABLE}
    # Every model column exists, with the PostgreSQL type its model declares.
    for table in metadata.tables.values():
        for col in table.columns:
            got = cols[(table.name, col.name)]["data_type"]
            if col.type is DOUBLE:
                assert got == "double precision", (table.name, col.name, got)
            elif col.type is BIG:
                assert got == "bigint", (table.name, col.name, got)
    assert not [k for k, v in cols.items() if v["data_type"] == "real"]  # 4 bytes: never
    ts = ["sessions.started_at", "sessions.ended_at", "sessions.last_activity_at", "messages.timestamp",
          "compression_locks.expires_at", "gateway_heartbeats.last_heartbeat", "async_delegations.dispatched_at"]
    for name in ts:
        assert cols[tuple(name.split("."))]["data_type"] == "double precision", name
    msg_id = cols[("messages", "id")]
    assert (msg_id["data_type"], msg_id["is_identity"], msg_id["identity_generation"]) == ("bigint", "YES", "BY DEFAULT")
    counters = ["input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens",
                "api_call_count", "message_count", "tool_call_count"]
    for name in counters:
        assert cols[("sessions", name)]["data_type"] == "bigint", name
    for name in counters[:6]:
        assert cols[("session_model_usage", name)]["data_type"] == "bigint", name
    assert cols[("messages", "token_count")]["data_type"] == "bigint"
    for name in ["sessions.model_config", "sessions.origin_json", "messages.tool_calls",
                 "messages.reasoning_details", "messages.display_metadata", "gateway_routing.entry_json",
                 "async_delegations.event_json", "async_delegations.result_json", "async_delegations.task_json"]:
        assert cols[tuple(name.split("."))]["data_type"] == "text", name
    assert cols[("messages", "display_identity")]["data_type"] == "bytea"
    search = cols[("messages", "search_vector")]
    assert (search["data_type"], search["is_generated"]) == ("tsvector", "ALWAYS")
    with pg_engine.connect() as conn:
        assert conn.execute(text("SELECT version FROM schema_version")).scalars().all() == [30]
        assert conn.execute(text(
            "SELECT value FROM state_meta WHERE key = 'hermes_store.cjk_bigram_high_water'")).scalar() == "-1"
        indexes = dict(conn.execute(text(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()")).all())
        assert conn.execute(text("SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm'")).scalar() == 1
    model_indexes = {ix.name for t in metadata.tables.values() for ix in t.indexes}
    assert model_indexes <= set(indexes)
    assert "WHERE (title IS NOT NULL)" in indexes["idx_sessions_title_unique"]
    assert "UNIQUE" in indexes["idx_sessions_title_unique"]
    assert "started_at DESC" in indexes["idx_sessions_started"]
    assert "active DESC, id DESC" in indexes["idx_messages_display_page"]
    assert "USING gin (search_vector)" in indexes["idx_messages_search_vector"]
    assert "gin_trgm_ops" in indexes["idx_messages_trgm"]


def test_hermes_sqlite_history_does_nothing_on_postgresql(pg_store: str, pg_engine: Engine) -> None:
    """0001…0030 and hs0001 are no-ops there: at 0030 only the version table exists."""
    assert migrations.upgrade(pg_store, "0030") == "0030"
    assert {t for t, _c in columns(pg_engine)} == {migrations.VERSION_TABLE}


def test_epoch_keeps_microseconds_and_counters_go_past_32_bits(pg_engine: Engine, pg_store: str) -> None:
    """A 4-byte ``real`` would store 1764547200.123456 as 1764547200.0 (or worse)."""
    migrations.upgrade(pg_store)
    stamp = 1764547200.123456
    big = 2**40 + 7
    with pg_engine.begin() as conn:
        conn.execute(insert(AgentSession.__table__).values(
            id="s1", source="cli", started_at=stamp, input_tokens=big, estimated_cost_usd=0.000123456789))
        ids = conn.execute(insert(Message.__table__).returning(Message.__table__.c.id), [
            {"session_id": "s1", "role": "user", "content": "hello world", "timestamp": stamp + 1,
             "token_count": 3},
            {"session_id": "s1", "role": "assistant", "content": '{"not json', "timestamp": stamp + 2,
             "token_count": big},
        ]).scalars().all()
    assert ids[1] == ids[0] + 1
    with pg_engine.connect() as conn:
        row = conn.execute(select(AgentSession.__table__)).mappings().one()
        assert row["started_at"] == stamp
        assert row["input_tokens"] == big
        assert row["estimated_cost_usd"] == 0.000123456789
        assert row["message_count"] == 0  # server default
        msgs = conn.execute(select(Message.__table__).order_by(Message.__table__.c.id)).mappings().all()
        assert [m["timestamp"] for m in msgs] == [stamp + 1, stamp + 2]
        assert msgs[1]["content"] == '{"not json' and msgs[1]["token_count"] == big
        assert msgs[0]["active"] == 1 and msgs[0]["compacted"] == 0


def test_search_vector_and_bigram_trigger_work(pg_engine: Engine, pg_store: str) -> None:
    """The generated tsvector is searchable (``simple``: no stemming), a 10 MB row is
    accepted (the vector is bounded under PostgreSQL's 1 MB limit), and a change below
    the bigram high-water mark records its block as dirty."""
    migrations.upgrade(pg_store)
    huge = " ".join(f"w{i}" for i in range(1_500_000))  # ~10 MB of distinct words
    with pg_engine.begin() as conn:
        conn.execute(insert(AgentSession.__table__).values(id="s", source="cli", started_at=1.0))
        conn.execute(insert(Message.__table__), [
            {"id": 5, "session_id": "s", "role": "user", "content": "Running dogs", "timestamp": 1.0,
             "tool_name": None, "tool_calls": None},
            {"id": 6, "session_id": "s", "role": "tool", "content": huge, "tool_name": "grep_tool",
             "tool_calls": None, "timestamp": 2.0},
            {"id": 130, "session_id": "s", "role": "assistant", "content": None, "tool_name": None,
             "tool_calls": '[{"name": "search_web"}]', "timestamp": 3.0},
        ])

    def hits(query: str) -> list[int]:
        with pg_engine.connect() as conn:
            return conn.execute(text(
                "SELECT id FROM messages WHERE search_vector @@ to_tsquery('simple', :q) ORDER BY id"
            ), {"q": query}).scalars().all()

    assert hits("running") == [5]
    assert hits("run") == []  # no stemming, as FTS5's unicode61
    assert hits("w10") == [6] and hits("grep_tool") == [6]
    assert hits("search_web") == [130]
    with pg_engine.begin() as conn:
        assert conn.execute(text("SELECT count(*) FROM messages_cjk_bigram_dirty")).scalar() == 0
        conn.execute(text("UPDATE state_meta SET value = '200' WHERE key = 'hermes_store.cjk_bigram_high_water'"))
        conn.execute(text("UPDATE messages SET content = 'changed' WHERE id IN (5, 130)"))
        conn.execute(text("UPDATE messages SET timestamp = 9 WHERE id = 6"))  # not a searched column
        conn.execute(insert(Message.__table__).values(session_id="s", role="user", content="x", timestamp=4.0,
                                                      id=70))
        dirty = conn.execute(text("SELECT block FROM messages_cjk_bigram_dirty ORDER BY block")).scalars().all()
    assert dirty == [0, 1, 2]


# ------------------------------------------------------------------ downgrade


def test_downgrade_base_removes_every_object_and_upgrades_again(pg_store: str, pg_engine: Engine) -> None:
    """pg_trgm stays installed (other schemas of the database may use it); its own
    objects belong to the extension and are not counted as ours."""
    before = our_objects(pg_engine)
    migrations.upgrade(pg_store)
    at_head = our_objects(pg_engine)
    assert "hermes_store_cjk_bigram_mark_dirty" in at_head["functions"]
    assert "messages_id_seq" in at_head["relkind_S"]  # the identity's sequence
    assert migrations.downgrade(pg_store, "base") is None
    after = our_objects(pg_engine)
    # Only Alembic's own (empty) version table is left, as on SQLite.
    assert after.pop("relkind_r") == {migrations.VERSION_TABLE}
    assert after.pop("relkind_i", set()) <= {f"{migrations.VERSION_TABLE}_pkc"}
    after["types"] -= {migrations.VERSION_TABLE, f"_{migrations.VERSION_TABLE}"}
    assert {k: v for k, v in after.items() if v} == {k: v for k, v in before.items() if v}
    with pg_engine.connect() as conn:
        assert conn.execute(text(f"SELECT count(*) FROM {migrations.VERSION_TABLE}")).scalar() == 0
    assert migrations.upgrade(pg_store) == HEAD
    assert our_objects(pg_engine) == at_head


# ------------------------------------------------------------------ autogenerate


def test_autogenerate_still_sees_a_real_change(pg_store: str, pg_engine: Engine) -> None:
    """The filters hide only the search objects and SQLite's nullable keys: a missing
    index or a wrong type is still reported."""
    from alembic.util.exc import AutogenerateDiffsDetected

    migrations.upgrade(pg_store)
    with pg_engine.begin() as conn:
        conn.execute(text("DROP INDEX idx_sessions_source"))
        # A column no trigger of ours names (PostgreSQL refuses to retype one that is).
        conn.execute(text("ALTER TABLE session_model_usage ALTER COLUMN first_seen TYPE real"))
    with pytest.raises(AutogenerateDiffsDetected) as info:
        command.check(migrations.make_config(pg_store))
    assert "idx_sessions_source" in str(info.value) and "first_seen" in str(info.value)


# ------------------------------------------------------------------ a host's transaction


# ------------------------------------------------------------------ hs0003: words as unicode61 cuts them


def search_objects(engine: Engine) -> dict[str, object]:
    """What the two search revisions decide: the vector's expression, the word index,
    the trigger function and our search functions, as the catalogs print them."""
    with engine.connect() as conn:
        expr = conn.execute(text(
            "SELECT generation_expression FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name = 'messages' AND column_name = 'search_vector'"
        )).scalar()
        index = conn.execute(text("SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema()"
                                  " AND indexname = 'idx_messages_search_vector'")).scalar()
        functions = dict(conn.execute(text(
            "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = current_schema() AND p.proname LIKE 'hermes_store%'"
        )).all())
        triggers = sorted(conn.execute(text(TRIGGERS)).scalars())
    return {"expression": expr, "index": index, "functions": functions, "triggers": triggers}


def words(engine: Engine, value: str) -> list[str]:
    with engine.connect() as conn:
        return conn.execute(text("SELECT hermes_store_search_words(:v)"), {"v": value}).scalar().split()


def found(engine: Engine, query: str) -> list[str]:
    with engine.connect() as conn:
        return sorted(h["content"] for h in (
            conn.execute(text("SELECT id, content FROM messages WHERE id = :i"), {"i": hit["id"]}).mappings().one()
            for hit in SearchRepository(conn).search_messages(query, limit=100)))


def add_rows(engine: Engine, *contents: str, before_hs0005: bool = False) -> None:
    """Messages of session ``s``. ``before_hs0005``: the store is at a revision whose
    trigger functions find the tenant's tables by the search_path (hs0005 pins it on each
    function); on Citus they run on the worker, which gets the writer's search_path only
    when told to pass it on, as such a writer had to (the coordinator's is not enough)."""
    with engine.begin() as conn:
        if before_hs0005 and conn.exec_driver_sql("SELECT count(*) FROM pg_extension WHERE extname = 'citus'").scalar():
            conn.exec_driver_sql("SET LOCAL citus.propagate_set_commands = 'local'")
            conn.exec_driver_sql(f'SET LOCAL search_path = "{conn.exec_driver_sql("SELECT current_schema()").scalar()}"')
        if not conn.execute(text("SELECT 1 FROM sessions WHERE id = 's'")).first():
            conn.execute(insert(AgentSession.__table__).values(id="s", source="cli", started_at=1.0))
        conn.execute(insert(Message.__table__), [
            {"session_id": "s", "role": "user", "content": c, "timestamp": float(i)} for i, c in enumerate(contents)])


def test_hs0003_splits_compounds_and_folds_accents(pg_store: str, pg_engine: Engine) -> None:
    migrations.upgrade(pg_store)
    assert words(pg_engine, "Mail user@Example.COM, see foo.example.com/main.py v1.2.3") == [
        "mail", "user", "example", "com", "see", "foo", "example", "com", "main", "py", "v1", "2", "3"]
    assert words(pg_engine, "Café naïve ÉCOLE e\u0301clair tiếng Straße ΟΔΟΣ") == [
        "cafe", "naive", "ecole", "eclair", "tiếng", "straße", "οδοσ"]
    assert words(pg_engine, "数据库迁移 Agent通信 hello🤔 x²y") == ["数据库迁移", "agent通信", "hello🤔", "x²y"]
    add_rows(pg_engine, "write to user@example.com", "un Café crème", "the job timed out")
    assert found(pg_engine, "example") == ["write to user@example.com"]
    assert found(pg_engine, "cafe creme") == ["un Café crème"]
    assert found(pg_engine, '"user example"') == ["write to user@example.com"]  # a phrase of its words
    with pg_engine.connect() as conn:
        vector = conn.execute(text("SELECT search_vector::text FROM messages WHERE content = 'the job timed out'")).scalar()
    assert vector == "'job':3 'out':5 'the':2 'timed':4"  # one position of gap before each column


def test_hs0003_upgrades_a_database_with_rows_and_downgrades_to_exactly_hs0002(pg_store: str, pg_engine: Engine) -> None:
    """Rows written at hs0002 are re-indexed by the upgrade; the downgrade puts back
    hs0002's column, index and trigger function as hs0002 made them; up/down/up agree."""
    assert migrations.upgrade(pg_store, "hs0002") == "hs0002"
    at_hs0002 = search_objects(pg_engine)
    add_rows(pg_engine, "write to user@example.com", "un Café crème", before_hs0005=True)
    assert migrations.upgrade(pg_store, "hs0003") == "hs0003"
    at_hs0003 = search_objects(pg_engine)
    assert set(at_hs0003["functions"]) - set(at_hs0002["functions"]) == {
        "hermes_store_search_words", "hermes_store_search_vector"}
    assert "hermes_store_search_vector" in at_hs0003["expression"] and at_hs0003["triggers"] == at_hs0002["triggers"]
    assert found(pg_engine, "example") == ["write to user@example.com"]
    assert found(pg_engine, "cafe") == ["un Café crème"]
    assert migrations.downgrade(pg_store, "hs0002") == "hs0002"
    assert search_objects(pg_engine) == at_hs0002
    with pg_engine.connect() as conn:
        old = conn.execute(text("SELECT search_vector::text FROM messages ORDER BY id")).scalars().all()
    assert old == ["'to':2 'user@example.com':3 'write':1", "'café':2 'crème':3 'un':1"]  # hs0002's parser again
    assert migrations.upgrade(pg_store, "hs0003") == "hs0003"
    assert search_objects(pg_engine) == at_hs0003
    assert found(pg_engine, "example") == ["write to user@example.com"]


def test_unreadable_high_water_does_not_break_writes(pg_store: str, pg_engine: Engine) -> None:
    """Under hs0002 a high-water value that is no number (``set_meta`` writes any text)
    made the dirty-block trigger's cast fail every insert; it now reads as -1."""
    migrations.upgrade(pg_store)
    add_rows(pg_engine, "first")
    for mark, dirty in (("garbage", []), ("  200 ", [0]), ("99999999999999999999", []), ("-1", [])):
        with pg_engine.begin() as conn:
            conn.execute(text("DELETE FROM messages_cjk_bigram_dirty"))
            conn.execute(text("UPDATE state_meta SET value = :v WHERE key = 'hermes_store.cjk_bigram_high_water'"),
                         {"v": mark})
            conn.execute(text("UPDATE messages SET content = 'changed' WHERE content IS NOT NULL"))
            conn.execute(insert(Message.__table__).values(session_id="s", role="user", content=mark, timestamp=9.0))
            assert conn.execute(text("SELECT block FROM messages_cjk_bigram_dirty")).scalars().all() == dirty, mark


def test_words_function_folds_through_icu_whatever_the_locale(pg_store: str, pg_engine: Engine) -> None:
    """The server picks the collation (ICU's root one here), and the bodies name their
    schema, so an empty search_path (pg_restore computes generated columns under one)
    cannot lose the functions."""
    migrations.upgrade(pg_store)
    schema = store_schema(pg_store)
    defs = search_objects(pg_engine)["functions"]
    assert 'COLLATE pg_catalog."und-x-icu"' in defs["hermes_store_search_words"]
    assert f"{schema}.hermes_store_search_words(value)" in defs["hermes_store_search_vector"]
    with pg_engine.begin() as conn:
        conn.execute(text("SET LOCAL search_path = ''"))
        vector = conn.execute(text(f"SELECT {schema}.hermes_store_search_vector('Ünïcode@Example')::text")).scalar()
    assert vector == "'example':3 'unicode':2"


def offline_script(write: Callable[[], None]) -> str:
    """What an Alembic command run with ``sql=True`` prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        write()
    return out.getvalue()


#: What ends a statement of a script, and what a ``;`` inside does not end: a quoted
#: string, a dollar-quoted body (``$do$ … $do$``), a comment.
_SCRIPT_TOKEN = re.compile(r"'(?:[^']|'')*'|(\$[A-Za-z_]*\$).*?\1|--[^\n]*|;", re.S)


def statements(sql: str) -> list[str]:
    """A script's statements, each on its own (as psql sends a file's)."""
    out, start = [], 0
    for token in _SCRIPT_TOKEN.finditer(sql):
        if token.group() == ";":
            out.append(sql[start:token.start()].strip())
            start = token.end()
    out.append(sql[start:].strip())
    return [s for s in out if s and not all(line.startswith("--") for line in s.splitlines() if line.strip())]


def run_script(engine: Engine, sql: str) -> None:
    """Run a whole offline script as psql would, in one transaction: on PostgreSQL as one
    string; on Citus one statement at a time, as ``psql -f`` sends them (a string of
    several statements is one Citus will not pass on to a worker: "cannot insert
    multiple commands into a prepared statement")."""
    raw = engine.raw_connection()
    try:
        with raw.cursor() as cur:
            citus = cur.execute("SELECT count(*) FROM pg_extension WHERE extname = 'citus'").fetchone()[0]
            for statement in statements(sql) if citus else [sql]:
                cur.execute(statement)
        raw.commit()
    finally:
        raw.close()


def test_script_statements_are_cut_where_psql_cuts_them() -> None:
    script = ("BEGIN;\n\n-- a comment; with a semicolon\nDO $do$\nBEGIN\n    PERFORM 1;\nEND\n$do$;\n\n"
              "SELECT 'a;b', 'it''s; here';\nCREATE FUNCTION f() RETURNS int AS $$ SELECT 1; $$ LANGUAGE sql;\n\nCOMMIT;\n")
    assert statements(script) == ["BEGIN", "-- a comment; with a semicolon\nDO $do$\nBEGIN\n    PERFORM 1;\nEND\n$do$",
                                  "SELECT 'a;b', 'it''s; here'",
                                  "CREATE FUNCTION f() RETURNS int AS $$ SELECT 1; $$ LANGUAGE sql", "COMMIT"]


def test_offline_sql_script_upgrades_like_online(pg_store: str, pg_engine: Engine) -> None:
    """``alembic upgrade --sql``: hs0003 decides on the server where the script runs."""
    migrations.upgrade(pg_store, "hs0002")
    add_rows(pg_engine, "write to user@example.com", before_hs0005=True)
    script = offline_script(lambda: command.upgrade(migrations.make_config(pg_store), "hs0002:hs0003", sql=True))
    assert "DO $do$" in script and "hermes_store_search_words" in script
    assert migrations.current(pg_store) == "hs0002"  # only written, not run
    run_script(pg_engine, script)
    assert migrations.current(pg_store) == "hs0003"
    assert found(pg_engine, "example") == ["write to user@example.com"]


def test_offline_sql_scripts_of_every_later_revision_run(pg_store: str, pg_engine: Engine) -> None:
    """``--sql`` up from hs0002 to head, then down to hs0004: each script runs as
    written. (Offline, Alembic doubles every ``%``: a revision whose SQL used format()
    wrote a script that failed; hs0005 builds its statements without one.)"""

    def pinned() -> set[tuple[str, str]]:
        with pg_engine.connect() as conn:
            return {(r[0], str(r[1])) for r in conn.exec_driver_sql(
                "SELECT proname, proconfig FROM pg_proc WHERE prorettype = 'trigger'::regtype"
                f" AND pronamespace = '{schema}'::regnamespace AND starts_with(proname, 'hermes_store_')")}

    schema = store_schema(pg_store)

    cfg = migrations.make_config(pg_store)
    migrations.upgrade(pg_store, "hs0002")
    up = offline_script(lambda: command.upgrade(cfg, "hs0002:head", sql=True))
    assert "%%" not in up
    run_script(pg_engine, up)
    assert migrations.current(pg_store) == HEAD
    assert {config for _name, config in pinned()} == {f"['search_path={schema}']"} and len(pinned()) == 5
    run_script(pg_engine, offline_script(lambda: command.downgrade(cfg, f"{HEAD}:hs0004", sql=True)))
    assert migrations.current(pg_store) == "hs0004"
    assert {config for _name, config in pinned()} == {"None"}


@pytest.mark.parametrize(("encoding", "locale", "expected"), [
    ("UTF8", "C", ["cafe", "user", "example", "com", "ǘber", "οδοσ"]),
    ("LATIN1", "C", ["café", "user", "example", "com"]),
])
def test_hs0003_in_other_encodings_and_locales(pg_url: str, encoding: str, locale: str, expected: list[str]) -> None:
    """A ``C`` locale folds as the default locale does (explicit collation, no
    [[:alnum:]]); a LATIN1 database gets the plainer function and still migrates."""
    name = f"hs_enc_{uuid.uuid4().hex[:12]}"
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE \"{name}\" TEMPLATE template0 ENCODING '{encoding}'"
                             f" LC_COLLATE '{locale}' LC_CTYPE '{locale}'")
    url = make_url(pg_url).set(database=name).render_as_string(hide_password=False)
    engine = create_engine(url)
    try:
        assert migrations.upgrade(url) == HEAD
        sample = "Café user@example.com" + (" ǗBER ΟΔΟΣ" if encoding == "UTF8" else "")
        assert words(engine, sample) == expected
        add_rows(engine, "mail user@example.com")
        assert found(engine, "example") == ["mail user@example.com"]
        assert migrations.downgrade(url, "base") is None
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def delegated_plan(engine: Engine, schema: str) -> str:
    """The plan of the searches' sub-agent probe in ``schema``, sequential scans off
    (a test table is small enough for the planner to prefer one)."""
    from hermes_store.search.delegated import DELEGATED_SQL

    with engine.connect() as conn:
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        sql = DELEGATED_SQL.format(sessions=f'"{schema}".sessions')
        return "\n".join(conn.exec_driver_sql("EXPLAIN " + sql.replace("%", "%%")).scalars())


def index_names(engine: Engine, schema: str) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(text("SELECT indexname FROM pg_indexes WHERE schemaname = :s"), {"s": schema}).scalars())


@pytest.mark.parametrize("schema", [None, "team_a"])
def test_hs0006_indexes_the_sub_agent_probe_and_goes_back(pg_store: str, pg_engine: Engine,
                                                          schema: str | None) -> None:
    """hs0006: the searches' probe for sessions that may be sub-agent transcripts reads
    the partial index (its predicate is the probe's own test, so the planner can use
    it), in the schema migrated; the downgrade drops exactly that index. ``team_a``:
    the schema named by the argument (on Citus: the store's distributed schema, named
    so instead of by its URL)."""
    url, tenant = split_store(pg_store)
    if schema is None:
        url, schema = pg_store, None
    elif tenant is None:
        with pg_engine.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    else:
        schema = tenant
    where = schema or store_schema(pg_store)
    assert migrations.upgrade(url, schema=schema) == HEAD
    assert PG_DELEGATED_INDEX in index_names(pg_engine, where)
    assert PG_DELEGATED_INDEX in delegated_plan(pg_engine, where)
    before = index_names(pg_engine, where)
    migrations.downgrade(url, "hs0005", schema=schema)
    assert index_names(pg_engine, where) == before - {PG_DELEGATED_INDEX, "pk_hermes_store_retention"}
    assert PG_DELEGATED_INDEX not in delegated_plan(pg_engine, where)
    assert migrations.upgrade(url, schema=schema) == HEAD
    assert index_names(pg_engine, where) == before


def test_hs0007_gives_schema_version_a_replica_identity_and_goes_back(pg_store: str, pg_engine: Engine) -> None:
    """hs0007: Hermes' keyless ``schema_version`` is identified by its whole row (what
    logical replication, and so a Citus move, needs); its columns and row stay as they
    were; the downgrade puts back the default identity."""
    def identity() -> str:
        with pg_engine.connect() as conn:
            return str(conn.execute(text("SELECT relreplident FROM pg_class WHERE oid = 'schema_version'::regclass"))
                       .scalar())

    def table() -> list[Any]:
        with pg_engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(
                "SELECT column_name, data_type, is_nullable FROM information_schema.columns"
                " WHERE table_schema = current_schema() AND table_name = 'schema_version' ORDER BY ordinal_position"))] + [
                tuple(r) for r in conn.execute(text("SELECT * FROM schema_version"))]

    assert migrations.upgrade(pg_store, "hs0006") == "hs0006"
    assert identity() == "d"
    shape = table()
    assert migrations.upgrade(pg_store) == HEAD
    assert identity() == "f" and table() == shape
    assert migrations.downgrade(pg_store, "hs0006") == "hs0006"
    assert identity() == "d" and table() == shape


def test_hs0008_holds_message_ids_past_2_31_in_display_order_and_goes_back(pg_store: str, pg_engine: Engine) -> None:
    """hs0008: ``display_order`` takes the message's id; at ``integer`` an id past 2^31 - 1
    made the append fail (``integer out of range``). As ``bigint`` it holds it; the
    downgrade goes back to ``integer`` once no order is too large for one."""
    def column_type() -> str:
        with pg_engine.connect() as conn:
            return str(conn.execute(text(
                "SELECT data_type FROM information_schema.columns"
                " WHERE table_schema = current_schema() AND table_name = 'messages' AND column_name = 'display_order'")
            ).scalar())

    assert migrations.upgrade(pg_store, "hs0007") == "hs0007"
    assert column_type() == "integer"
    add_rows(pg_engine, "small id")
    assert migrations.upgrade(pg_store) == HEAD
    assert column_type() == "bigint"
    big = 2**40
    with pg_engine.begin() as conn:
        conn.execute(insert(Message.__table__).values(id=big, session_id="s", role="user", content="big id",
                                                      timestamp=2.0))
        assert conn.execute(text("SELECT display_order FROM messages WHERE id = :i"), {"i": big}).scalar() == big
        conn.execute(text("DELETE FROM messages WHERE id = :i"), {"i": big})
    assert migrations.downgrade(pg_store, "hs0007") == "hs0007"
    assert column_type() == "integer"
