"""Per-tenant PostgreSQL schemas: one database, several stores that never meet.

``SessionDB(url, schema=…)``, ``UnitOfWork(engine, schema=…)``, ``migrations.*(…, schema=…)``,
``?schema=`` in a URL, ``hermes-store --schema`` and ``alembic -x schema=`` keep one
tenant's tables, indexes, version table, functions, triggers and search objects in its
own schema. Shown here: where every object goes, that tenants (and a store in
``public``) never see each other's sessions, searches, titles or counters, that
migrating one tenant leaves the others as they were, that bad names and SQLite are
refused before anything connects, and the sharing proof: four processes, two tenants,
two writers each, appending, titling and searching at once.

The PostgreSQL cases need ``HERMES_STORE_TEST_PG_URL`` (see conftest.pg_url); the one
SQLite case shows the refusal there. The cases that take ``tenants`` (or ``backend``) run
again on the Citus test cluster (``[citus]``), each tenant a distributed schema of its
own, the two on the two workers (conftest ``citus_schemas``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, text
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy.engine import make_url

from hermes_store import SessionDB, UnitOfWork, errors, migrations
from hermes_store.engine import create_engine

from .helpers import in_schema
from .test_cli import ok, one_line_error, run

pytestmark = [pytest.mark.both_backends, pytest.mark.on_citus]

ROOT = Path(__file__).resolve().parent.parent
HEAD = migrations.head()
#: A server nobody listens on: reaching the network here would be a DatabaseUnavailableError.
UNREACHABLE = "postgresql+psycopg://nobody@127.0.0.1:1/nowhere"

BAD_NAMES = [
    "",
    "Team_a",  # upper case would be folded (or need quotes) depending on who writes it
    "1team",
    "pg_team",
    "information_schema",
    "team-a",
    "team a",
    'team"; DROP SCHEMA public CASCADE; --',
    "équipe",
    "team\n",
    "t" * 64,  # PostgreSQL would cut it to 63 characters silently
]


@pytest.fixture
def plain(pg_database: str) -> Iterator[Engine]:
    """A plain SQLAlchemy engine on the test database, for looking at the catalogs."""
    eng = sa_create_engine(pg_database)
    yield eng
    eng.dispose()


@dataclass
class Tenants:
    """Two tenant schemas ``a`` and ``b`` of the database at ``url`` (``plain``: an engine
    there for the catalogs)."""

    url: str
    plain: Engine
    a: str
    b: str


@pytest.fixture
def tenants(server: str, request: pytest.FixtureRequest) -> Iterator[Tenants]:
    """``[postgresql]``: team_a and team_b of a fresh database (made by the first
    migration); ``[citus]``: two fresh distributed schemas on the cluster, on its two workers."""
    if server == "citus":
        new: Callable[[], str] = request.getfixturevalue("citus_schemas")
        url, a, b = request.getfixturevalue("citus_url"), new(), new()
    else:
        url, a, b = request.getfixturevalue("pg_database"), "team_a", "team_b"
    eng = sa_create_engine(url)
    yield Tenants(url, eng, a, b)
    eng.dispose()


def tenant_url(url: str, schema: str) -> str:
    return make_url(url).update_query_dict({"schema": schema}).render_as_string(hide_password=False)


def objects_in(conn: Connection, schema: str) -> set[tuple[str, str]]:
    """(kind, name) of every relation, function and trigger in ``schema`` that is not an
    extension's own (pg_trgm's functions live in public and belong to the extension)."""
    rows = conn.execute(
        text(
            """
            SELECT 'rel:' || c.relkind::text, c.relname::text FROM pg_class c
              JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = :s AND NOT EXISTS (
                   SELECT 1 FROM pg_depend d WHERE d.objid = c.oid AND d.deptype = 'e')
            UNION ALL
            SELECT 'function', p.proname::text FROM pg_proc p
              JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = :s AND NOT EXISTS (
                   SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')
            UNION ALL
            SELECT 'trigger', t.tgname::text FROM pg_trigger t
              JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = :s AND NOT t.tgisinternal
            """
        ),
        {"s": schema},
    )
    return {(kind, name) for kind, name in rows}


def signature(conn: Connection, schema: str) -> dict[str, Any]:
    """Everything of a tenant that a migration of another tenant could change: object
    identities (OIDs: nothing dropped and made again), definitions, version, data."""
    q = {
        "relations": "SELECT c.relname, c.oid::bigint, c.relkind FROM pg_class c JOIN pg_namespace n"
        " ON n.oid = c.relnamespace WHERE n.nspname = :s ORDER BY 1",
        "columns": "SELECT table_name, column_name, data_type, is_nullable, column_default, generation_expression"
        " FROM information_schema.columns WHERE table_schema = :s ORDER BY 1, 2",
        "indexes": "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = :s ORDER BY 1",
        "functions": "SELECT p.proname, p.oid::bigint, pg_get_functiondef(p.oid) FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = :s ORDER BY 1",
        "triggers": "SELECT t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c"
        " ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = :s AND NOT t.tgisinternal ORDER BY 1",
    }
    out: dict[str, Any] = {k: [tuple(r) for r in conn.execute(text(sql), {"s": schema})] for k, sql in q.items()}
    out["version"] = conn.exec_driver_sql(f'SELECT version_num FROM "{schema}".hermes_store_version').all()
    out["sessions"] = conn.exec_driver_sql(
        f'SELECT id, title, message_count, input_tokens FROM "{schema}".sessions ORDER BY id').all()
    out["messages"] = conn.exec_driver_sql(
        f'SELECT id, session_id, content, display_order FROM "{schema}".messages ORDER BY id').all()
    out["state_meta"] = conn.exec_driver_sql(f'SELECT key, value FROM "{schema}".state_meta ORDER BY key').all()
    return out


def fill(db: SessionDB, marker: str) -> None:
    """The same session ids and title in every tenant, with tenant-specific text."""
    db.create_session("s1", "cli", model="m")
    db.create_session("s2", "telegram")
    db.append_message("s1", "user", f"deploy the {marker} service, café style")
    db.append_message("s1", "assistant", f"{marker} 日本語のテキスト", tool_calls=[{"id": "c1", "name": "shell"}])
    db.append_message("s2", "user", f"substring{marker}inside")
    db.update_token_counts("s1", input_tokens=10, output_tokens=5)
    db.set_session_title("s1", "Release plan")


# ---------------------------------------------------------------------- refusals


@pytest.mark.parametrize("bad", BAD_NAMES, ids=repr)
def test_bad_schema_names_are_refused_before_connecting(bad: str) -> None:
    """Every entry point refuses the name itself: reaching the (unreachable) server
    would have been a DatabaseUnavailableError instead."""
    calls = [
        lambda: create_engine(UNREACHABLE, schema=bad),
        lambda: SessionDB(UNREACHABLE, schema=bad),
        lambda: SessionDB(tenant_url(UNREACHABLE, bad)),
        lambda: migrations.upgrade(UNREACHABLE, schema=bad),
        lambda: migrations.upgrade(tenant_url(UNREACHABLE, bad)),
        lambda: migrations.current(UNREACHABLE, schema=bad),
        lambda: migrations.downgrade(UNREACHABLE, "base", schema=bad),
        lambda: migrations.stamp(UNREACHABLE, "head", schema=bad),
        lambda: UnitOfWork(create_engine(UNREACHABLE), schema=bad),
        lambda: migrations.make_config(UNREACHABLE, schema=bad),
    ]
    for call in calls:
        with pytest.raises(errors.InvalidInputError, match="not a plain identifier"):
            call()
    # The same calls with a good name do go to the network (and fail there), so the
    # refusal above came first.
    with pytest.raises(errors.DatabaseUnavailableError):
        migrations.current(UNREACHABLE, schema="team_a")
    with pytest.raises(errors.DatabaseUnavailableError):
        SessionDB(UNREACHABLE, schema="team_a")


@pytest.mark.parametrize("bad", [7, b"team_a", ["team_a"]], ids=repr)
def test_a_schema_that_is_not_text_is_refused(bad: Any) -> None:
    for call in (
        lambda: SessionDB(UNREACHABLE, schema=bad),
        lambda: UnitOfWork(create_engine(UNREACHABLE), schema=bad),
        lambda: migrations.upgrade(UNREACHABLE, schema=bad),
    ):
        with pytest.raises(errors.InvalidInputError, match="not a plain identifier"):
            call()


def test_a_url_naming_two_schemas_is_refused() -> None:
    with pytest.raises(errors.InvalidInputError, match="2 schemas"):
        SessionDB(UNREACHABLE + "?schema=team_a&schema=team_b")


def test_schema_is_a_postgresql_feature(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """On SQLite every entry point refuses ``schema=`` (a file has no schemas) and
    creates nothing; on PostgreSQL the same call opens the tenant."""
    if backend == "citus":  # a distributed schema named by the URL, or by the argument
        url = request.getfixturevalue("citus_store")
        base = request.getfixturevalue("citus_url")
        tenant = make_url(url).query["schema"]
        with SessionDB(base, schema=tenant) as db:
            db.create_session("s1", "cli")
        with SessionDB(url) as db:
            assert db.session_count() == 1
        assert migrations.current(url) == migrations.current(base, schema=tenant) == HEAD
        assert url == in_schema(base, tenant)
        return
    if backend == "postgresql":
        url = request.getfixturevalue("pg_database")
        with SessionDB(url, schema="team_a") as db:
            db.create_session("s1", "cli")
            assert db.session_count() == 1
        assert migrations.current(url, schema="team_a") == HEAD
        assert migrations.current(url) is None  # public holds nothing of ours
        return
    path = tmp_path / "home" / "state.db"
    path.parent.mkdir()
    sqlite_url = f"sqlite:///{path}"
    calls = [
        lambda: SessionDB(path, schema="team_a"),
        lambda: SessionDB(sqlite_url, schema="team_a"),
        lambda: migrations.upgrade(path, schema="team_a"),
        lambda: migrations.upgrade(sqlite_url + "?schema=team_a"),
        lambda: migrations.current(path, schema="team_a"),
        lambda: migrations.stamp(path, "head", schema="team_a"),
        lambda: create_engine(path, schema="team_a"),
        lambda: create_engine(sqlite_url + "?schema=team_a"),
    ]
    for call in calls:
        with pytest.raises(errors.InvalidInputError, match="PostgreSQL"):
            call()
    assert list(path.parent.iterdir()) == []  # nothing was created
    migrations.upgrade(path)
    engine = create_engine(path)
    try:
        with pytest.raises(errors.InvalidInputError, match="PostgreSQL"):
            UnitOfWork(engine, schema="team_a")
    finally:
        engine.dispose()


def test_two_different_schemas_for_one_store_are_refused(pg_database: str, plain: Engine) -> None:
    with pytest.raises(errors.InvalidInputError, match="pick one"):
        SessionDB(tenant_url(pg_database, "team_a"), schema="team_b")
    with pytest.raises(errors.InvalidInputError, match="pick one"):
        migrations.upgrade(tenant_url(pg_database, "team_a"), schema="team_b")
    engine = create_engine(pg_database, schema="team_a")
    try:
        with pytest.raises(errors.InvalidInputError, match="pick one"):
            UnitOfWork(engine, schema="team_b")
        with pytest.raises(errors.InvalidInputError, match="pick one"):
            migrations.upgrade(engine, schema="team_b")
    finally:
        engine.dispose()
    with plain.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'team%%'").scalar() == 0


# ---------------------------------------------------------------------- where things go


def test_every_object_of_a_tenant_lives_in_its_schema(pg_database: str, plain: Engine) -> None:
    assert migrations.upgrade(pg_database, schema="team_a") == HEAD
    with plain.connect() as conn:
        in_tenant = objects_in(conn, "team_a")
        # Nothing of ours outside the tenant: public holds only the shared extension.
        assert objects_in(conn, "public") == set()
        ext = conn.exec_driver_sql(
            "SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'pg_trgm'").all()
        assert ext == [("public",)]
        assert conn.exec_driver_sql("SELECT version_num FROM team_a.hermes_store_version").all() == [(HEAD,)]
        # The stored search column calls the tenant's own functions, by schema.
        expr = conn.exec_driver_sql(
            "SELECT generation_expression FROM information_schema.columns"
            " WHERE table_schema = 'team_a' AND table_name = 'messages' AND column_name = 'search_vector'").scalar()
        assert "team_a.hermes_store_search_vector" in expr
        # Every trigger on the tenant's tables runs a function of the tenant.
        triggers = conn.exec_driver_sql(
            "SELECT DISTINCT pn.nspname FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid"
            " JOIN pg_namespace pn ON pn.oid = p.pronamespace JOIN pg_class c ON c.oid = t.tgrelid"
            " JOIN pg_namespace cn ON cn.oid = c.relnamespace WHERE cn.nspname = 'team_a' AND NOT t.tgisinternal"
        ).all()
        assert triggers == [("team_a",)]
    # The default store, made in public afterwards, has exactly the same objects.
    assert migrations.upgrade(pg_database) == HEAD
    with plain.connect() as conn:
        in_public = objects_in(conn, "public")
        assert in_public == in_tenant
        assert ("rel:r", "hermes_store_version") in in_tenant and ("rel:i", "idx_messages_trgm") in in_tenant
        assert ("function", "hermes_store_search_words") in in_tenant
        assert ("trigger", "messages_cjk_bigram_dirty_insert") in in_tenant
        assert ("trigger", "messages_display_order_insert") in in_tenant
    assert migrations.current(pg_database, schema="team_a") == migrations.current(pg_database) == HEAD


def test_current_of_a_missing_tenant_is_none_and_creates_nothing(pg_database: str, plain: Engine) -> None:
    migrations.upgrade(pg_database)  # a store in public must not stand in for the tenant
    assert migrations.current(pg_database, schema="nobody") is None
    assert migrations.downgrade(pg_database, "base", schema="nobody") is None
    with plain.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM pg_namespace WHERE nspname = 'nobody'").scalar() == 0


# ---------------------------------------------------------------------- isolation


def test_tenants_and_the_default_store_never_see_each_other(pg_database: str) -> None:
    stores = {
        "public": SessionDB(pg_database),
        "team_a": SessionDB(pg_database, schema="team_a"),
        "team_b": SessionDB(tenant_url(pg_database, "team_b")),
    }
    try:
        for marker, db in stores.items():
            fill(db, marker.replace("_", ""))
        for marker, db in stores.items():
            mine = marker.replace("_", "")
            others = [m.replace("_", "") for m in stores if m != marker]
            # Sessions and counters: each store sees its own two sessions, three messages.
            assert db.session_count() == 2 and db.message_count() == 3
            s1 = db.get_session("s1")
            assert (s1["message_count"], s1["tool_call_count"], s1["input_tokens"]) == (2, 1, 10)
            assert [m["content"] for m in db.get_messages("s2")] == [f"substring{mine}inside"]
            # Message ids: every tenant has its own identity sequence.
            assert [m["id"] for m in db.get_messages("s1")] == [1, 2]
            # Titles: the same title in every store, still unique within one.
            assert db.get_session_by_title("Release plan")["id"] == "s1"
            with pytest.raises(errors.TitleConflictError):
                db.set_session_title("s2", "Release plan")
            # Searches: words, CJK, tool calls and substrings find only this store's rows.
            for query in ("deploy", "cafe", "日本語", "テキスト", "shell", "substring*"):
                found = json.dumps(db.search_messages(query), ensure_ascii=False)
                assert mine in found, query
                assert all(other not in found for other in others), query
            assert db.search_messages(mine) and all(not db.search_messages(o) for o in others)
            assert [s["id"] for s in db.search_sessions(source="telegram")] == ["s2"]
            assert {s["id"] for s in db.list_sessions_rich()} == {"s1", "s2"}
            # Upkeep of the search indexes runs on this store's own indexes.
            checked = db.check_fts()
            assert set(checked) == {"idx_messages_search_vector", "idx_messages_trgm"}
            assert all(problem is None for problem in checked.values()), checked
            assert db.rebuild_fts() and db.optimize_fts()
            assert db.search_messages("deploy")
        # Writes in one store change nothing in the others.
        stores["team_a"].delete_session("s2")
        stores["team_a"].set_meta("who", "team_a")
        stores["team_a"].set_session_title("s1", None)
        assert stores["team_a"].session_count() == 1 and stores["team_a"].resolve_session_id("s2") is None
        assert stores["team_b"].session_count() == stores["public"].session_count() == 2
        assert stores["team_b"].resolve_session_id("s2") == stores["public"].resolve_session_id("s2") == "s2"
        assert stores["team_b"].get_session_title("s1") == "Release plan"
        assert stores["team_b"].get_meta("who") is None and stores["public"].get_meta("who") is None
        export = stores["team_b"].export_session("s2")
        assert [m["content"] for m in export["messages"]] == ["substringteambinside"]
    finally:
        for db in stores.values():
            db.close()


def test_an_engine_keeps_its_tenant(pg_database: str) -> None:
    """A tenant engine's URL names its schema, so whatever is handed the engine (SessionDB,
    migrations, UnitOfWork) stays in that tenant."""
    engine = create_engine(pg_database, schema="team_a")
    try:
        assert engine.url.query["schema"] == "team_a"
        assert migrations.upgrade(engine) == HEAD
        with SessionDB(engine=engine) as db:
            db.create_session("s1", "cli")
            db.append_message("s1", "user", "hello tenant")
        with UnitOfWork(engine) as uow:
            assert uow.sessions.get("s1") is not None
        assert migrations.current(pg_database) is None
        assert migrations.current(pg_database, schema="team_a") == HEAD
    finally:
        engine.dispose()


def test_unit_of_work_in_a_schema_on_a_plain_engine(pg_database: str) -> None:
    migrations.upgrade(pg_database)
    migrations.upgrade(pg_database, schema="team_a")
    engine = create_engine(pg_database)  # bound to no tenant: public is its default
    try:
        with engine.connect() as conn:
            path_before = conn.exec_driver_sql("SHOW search_path").scalar()
        with UnitOfWork(engine, schema="team_a") as uow:
            uow.sessions.create("s1", "cli")
            uow.messages.append("s1", "user", "inside the tenant")
            uow.commit()  # the next transaction works in the tenant as well
            uow.messages.append("s1", "user", "still inside")
            assert uow.search.search_messages("inside")
        with UnitOfWork(engine) as uow:  # the same pool, the default schema
            assert uow.sessions.get("s1") is None
            assert not uow.search.search_messages("inside")
        with engine.connect() as conn:  # nothing of the tenant was left on pooled connections
            assert conn.exec_driver_sql("SHOW search_path").scalar() == path_before
            assert conn.exec_driver_sql("SELECT count(*) FROM team_a.messages").scalar() == 2
            assert conn.exec_driver_sql("SELECT count(*) FROM public.messages").scalar() == 0
        # A tenant never migrated is NotMigratedError, never the store in public.
        with pytest.raises(errors.NotMigratedError):
            with UnitOfWork(engine, schema="team_z") as uow:
                uow.sessions.get("s1")
        with pytest.raises(errors.NotMigratedError):
            with UnitOfWork(engine, schema="team_z") as uow:
                uow.search.search_messages("inside")
    finally:
        engine.dispose()
    public = create_engine(pg_database)
    with UnitOfWork(public) as uow:  # public gets rows a tenant must never read
        uow.sessions.create("s1", "cli")
        uow.messages.append("s1", "user", "inside public")
    public.dispose()
    unmigrated = create_engine(pg_database, schema="team_z")  # a tenant engine: the same refusal
    try:
        for read in (lambda u: u.sessions.get("s1"), lambda u: u.search.search_messages("inside"),
                     lambda u: u.messages.get_messages("s1")):
            with pytest.raises(errors.NotMigratedError):
                with UnitOfWork(unmigrated) as uow:
                    read(uow)
    finally:
        unmigrated.dispose()


def test_triggers_and_search_functions_resolve_in_their_own_tenant(tenants: Tenants) -> None:
    """hs0002's and hs0004's PL/pgSQL functions name tables without a schema: each
    tenant's copy must read and write that tenant's tables only."""
    a = SessionDB(tenants.url, schema=tenants.a)
    b = SessionDB(tenants.url, schema=tenants.b)
    try:
        # Make a's bigram index think every row is already indexed (so a new or
        # edited row marks its block dirty); b keeps the shipped -1.
        a.set_meta("hermes_store.cjk_bigram_high_water", "1000")
        for db in (a, b):
            db.create_session("s1", "cli")
            db.append_message("s1", "user", "中文内容")
        with tenants.plain.connect() as conn:
            assert conn.exec_driver_sql(f"SELECT count(*) FROM {tenants.a}.messages_cjk_bigram_dirty").scalar() == 1
            assert conn.exec_driver_sql(f"SELECT count(*) FROM {tenants.b}.messages_cjk_bigram_dirty").scalar() == 0
            for schema in (tenants.a, tenants.b):  # the BEFORE INSERT display-order trigger ran in each
                assert [r[0] for r in conn.exec_driver_sql(f"SELECT display_order FROM {schema}.messages")] == [
                    conn.exec_driver_sql(f"SELECT id FROM {schema}.messages").scalar()]
        # Words fold by the tenant's own function (Café → cafe) on both sides.
        a.append_message("s1", "user", "Café CRÈME")
        assert [h["session_id"] for h in a.search_messages("creme cafe")] == ["s1"]
        assert b.search_messages("creme") == []
    finally:
        a.close()
        b.close()


def test_a_foreign_connection_writing_into_a_tenant_fires_that_tenants_triggers(
    pg_database: str, plain: Engine
) -> None:
    """hs0005: a writer with the default search_path (psql, a host's engine) writing into
    ``team_a.messages`` runs team_a's triggers against team_a's tables, never public's."""
    public = SessionDB(pg_database)
    a = SessionDB(pg_database, schema="team_a")
    insert = ("INSERT INTO {schema}.messages (session_id, role, content, timestamp, display_identity)"
              " VALUES ('s1', 'user', {content!r}, 1.0, '\\x01'::bytea) RETURNING id")
    try:
        public.create_session("s1", "cli")
        a.create_session("s1", "cli")
        a.append_message("s1", "user", "filler")
        a.append_message("s1", "user", "filler")
        a.set_meta("hermes_store.cjk_bigram_high_water", "1000")
        with plain.begin() as conn:
            assert conn.exec_driver_sql("SHOW search_path").scalar() == '"$user", public'
            # public: a visible row with identity 01 and order 1, the wrong peer to find.
            public_id = conn.exec_driver_sql(insert.format(schema="public", content="p")).scalar()
            peer = conn.exec_driver_sql(insert.format(schema="team_a", content="peer")).scalar()
            new_id = conn.exec_driver_sql(insert.format(schema="team_a", content="中文 peer")).scalar()
            # Hidden, then visible again: the visibility trigger updates its peers.
            conn.exec_driver_sql(f"UPDATE team_a.messages SET active = 0 WHERE id = {new_id}")
            conn.exec_driver_sql(f"UPDATE team_a.messages SET active = 1 WHERE id = {new_id}")
        with plain.connect() as conn:
            orders = dict(conn.exec_driver_sql("SELECT id, display_order FROM team_a.messages").all())
            assert (peer, orders[peer]) == (3, 3) and orders[new_id] == 3  # team_a's own peer
            assert conn.exec_driver_sql("SELECT id, display_order FROM public.messages").all() == [(public_id, public_id)]
            assert conn.exec_driver_sql("SELECT count(*) FROM team_a.messages_cjk_bigram_dirty").scalar() == 1
            assert conn.exec_driver_sql("SELECT count(*) FROM public.messages_cjk_bigram_dirty").scalar() == 0
            pinned = conn.exec_driver_sql(
                "SELECT p.proname, p.proconfig FROM pg_proc p"
                " WHERE p.pronamespace = 'team_a'::regnamespace AND p.prorettype = 'trigger'::regtype").all()
        assert len(pinned) == 5 and all(cfg == ["search_path=team_a"] for _name, cfg in pinned)
        assert [m["id"] for m in a.search_messages("中文")] == [new_id]
    finally:
        public.close()
        a.close()


def test_vacuum_of_a_tenant_works_on_its_own_tables(pg_database: str, plain: Engine) -> None:
    a = SessionDB(pg_database, schema="team_a")
    b = SessionDB(pg_database, schema="team_b")
    try:
        a.vacuum()
    finally:
        a.close()
        b.close()
    with plain.connect() as conn:
        done = dict(conn.exec_driver_sql(
            "SELECT schemaname, count(last_vacuum) FROM pg_stat_user_tables"
            " WHERE schemaname IN ('team_a', 'team_b') GROUP BY 1").all())
    assert done["team_a"] > 0 and done["team_b"] == 0


# ---------------------------------------------------------------------- migrations per tenant


def test_migrating_one_tenant_leaves_the_others_untouched(tenants: Tenants) -> None:
    pg_database, plain, team_a, team_b = tenants.url, tenants.plain, tenants.a, tenants.b
    for schema in (team_a, team_b):
        with SessionDB(pg_database, schema=schema) as db:
            fill(db, schema.replace("_", ""))
    with plain.connect() as conn:
        before = signature(conn, team_b)
    down = paths_order()[paths_order().index(HEAD) - 2]
    assert migrations.downgrade(pg_database, down, schema=team_a) == down
    assert migrations.current(pg_database, schema=team_b) == HEAD
    with pytest.raises(errors.InvalidInputError, match="cannot go back"):
        migrations.upgrade(pg_database, down, schema=team_b)
    assert migrations.upgrade(pg_database, schema=team_a) == HEAD
    with plain.connect() as conn:
        assert signature(conn, team_b) == before
    # downgrade base removes this tenant's objects and nothing else.
    assert migrations.downgrade(pg_database, "base", schema=team_a) is None
    with plain.connect() as conn:
        # Only Alembic's (now empty) version table and its key are left, as in a database at base.
        assert objects_in(conn, team_a) == {("rel:r", "hermes_store_version"), ("rel:i", "hermes_store_version_pkc")}
        assert conn.exec_driver_sql(f"SELECT count(*) FROM {team_a}.hermes_store_version").scalar() == 0
        assert signature(conn, team_b) == before
        assert objects_in(conn, "public") == set()
        assert conn.exec_driver_sql("SELECT count(*) FROM pg_extension WHERE extname = 'pg_trgm'").scalar() == 1
    with SessionDB(pg_database, schema=team_b) as b:  # the other tenant still works, search included
        b.append_message("s2", "user", "after the neighbour left")
        assert [h["session_id"] for h in b.search_messages("neighbour")] == ["s2"]
    # And the emptied tenant comes back empty.
    with SessionDB(pg_database, schema=team_a) as a:
        assert a.session_count() == 0
        assert a.search_messages("deploy") == []


def paths_order() -> tuple[str, ...]:
    from hermes_store import paths

    return paths.revision_order()


@pytest.mark.parametrize("end", ["commit", "rollback"])
def test_migrating_a_tenant_inside_the_callers_transaction(pg_database: str, end: str) -> None:
    engine = create_engine(pg_database)
    try:
        with engine.connect() as conn:
            path_before = conn.exec_driver_sql("SHOW search_path").scalar()
            conn.rollback()
            conn.begin()
            assert migrations.upgrade(conn, schema="team_a") == HEAD
            assert conn.in_transaction()  # still the caller's transaction
            assert conn.exec_driver_sql("SHOW search_path").scalar() == path_before  # put back
            getattr(conn, end)()
        expected = HEAD if end == "commit" else None
        assert migrations.current(pg_database, schema="team_a") == expected
        with engine.connect() as conn:
            exists = conn.exec_driver_sql("SELECT count(*) FROM pg_namespace WHERE nspname = 'team_a'").scalar()
        assert exists == (1 if end == "commit" else 0)
        # On an Engine: its pooled connections come back with their own search_path.
        assert migrations.upgrade(engine, schema="team_b") == HEAD
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW search_path").scalar() == path_before
    finally:
        engine.dispose()


def test_stamp_of_a_tenant(pg_database: str, plain: Engine) -> None:
    migrations.stamp(pg_database, "hs0002", schema="team_a")
    assert migrations.current(pg_database, schema="team_a") == "hs0002"
    with plain.connect() as conn:
        assert objects_in(conn, "team_a") >= {("rel:r", "hermes_store_version")}
        assert ("rel:r", "sessions") not in objects_in(conn, "team_a")
    assert migrations.current(pg_database) is None


# ---------------------------------------------------------------------- command lines


def test_cli_schema_option(pg_database: str, tmp_path: Path) -> None:
    url = ("--url", pg_database)
    doc = ok(*url, "--schema", "team_a", "--json", "upgrade").json()
    assert (doc["created"], doc["revision"]) == (True, HEAD)
    assert "schema=team_a" in doc["db"] and "sessions" in doc["tables"]
    public = run(*url, "--json", "current")  # public: nothing, so current exits 1
    assert (public.code, public.json()["revision"]) == (1, None)
    assert ok(*url, "--schema", "team_a", "--json", "current").json()["revision"] == HEAD
    ok(*url, "--schema", "team_b", "upgrade")
    with SessionDB(pg_database, schema="team_a") as a, SessionDB(pg_database, schema="team_b") as b:
        fill(a, "teama")
        fill(b, "teamb")
        b.create_session("only-b", "cli")
    listed = ok(*url, "--schema", "team_a", "--json", "sessions").json()
    assert {s["id"] for s in listed["sessions"]} == {"s1", "s2"}
    found = ok(*url, "--schema", "team_b", "--json", "search", "deploy").json()["results"]
    assert found and all("teamb" in json.dumps(h) and "teama" not in json.dumps(h) for h in found)
    assert ok(f"--url={tenant_url(pg_database, 'team_b')}", "--json", "sessions").json()["sessions"]
    # Bad arguments: one line, exit 2, nothing connected to or created.
    line = one_line_error(run(*url, "--schema", "Team-A", "current"), 2)
    assert "--schema" in line and "plain identifier" in line
    line = one_line_error(run("--db", str(tmp_path / "s.db"), "--schema", "team_a", "current"), 2)
    assert "--schema needs a PostgreSQL --url" in line
    line = one_line_error(run("--url", f"sqlite:///{tmp_path / 's.db'}", "--schema", "team_a", "current"), 2)
    assert "PostgreSQL" in line
    line = one_line_error(run("--url", tenant_url(pg_database, "pg_x"), "current"), 2)
    assert "--url" in line and "plain identifier" in line
    line = one_line_error(run("--url", tenant_url(pg_database, "team_a"), "--schema", "team_b", "current"), 2)
    assert "pick one" in line
    assert not (tmp_path / "s.db").exists()


def test_alembic_command_line_per_tenant(pg_database: str, tmp_path: Path, plain: Engine) -> None:
    migrations.upgrade(pg_database)  # a store in public: the tenant's check must not compare it
    alembic_bin = Path(sys.executable).with_name("alembic")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [str(alembic_bin), "-c", str(ROOT / "alembic.ini"), "-x", f"url={pg_database}", "-x", "schema=team_a"]

    def alembic(*args: str) -> str:
        done = subprocess.run([*cmd, *args], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return done.stdout + done.stderr

    alembic("upgrade", "head")
    assert migrations.current(pg_database, schema="team_a") == HEAD
    assert "No new upgrade operations detected" in alembic("check")
    assert HEAD in alembic("current")
    alembic("downgrade", "base")
    assert migrations.current(pg_database, schema="team_a") is None
    assert migrations.current(pg_database) == HEAD
    with plain.connect() as conn:
        assert ("rel:r", "sessions") not in objects_in(conn, "team_a")
        assert ("rel:r", "sessions") in objects_in(conn, "public")
    # Alembic's Python API with our Config: the same, for a host that drives Alembic itself.
    from alembic import command

    command.upgrade(migrations.make_config(pg_database, schema="team_b"), "head")
    assert migrations.current(pg_database, schema="team_b") == HEAD
    command.check(migrations.make_config(pg_database, schema="team_b"))  # raises on any difference
    command.downgrade(migrations.make_config(tenant_url(pg_database, "team_b")), "base")
    assert migrations.current(pg_database, schema="team_b") is None
    assert migrations.current(pg_database) == HEAD


OPENER = r"""
import sys
from hermes_store import SessionDB
url, me = sys.argv[1], sys.argv[2]
with SessionDB(url) as db:
    db.ensure_session("s", "cli")
    db.append_message("s", "user", f"opened by {me}")
"""


def test_processes_opening_one_new_default_store_at_once(pg_database: str) -> None:
    """The lock that serializes a tenant's first migration serves the default schema too:
    without it, one of several processes opening a new database fails half-way
    through the revisions (Alembic finds its version row moved under it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    running = [subprocess.Popen([sys.executable, "-c", OPENER, pg_database, str(k)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(3)]
    for proc in running:
        _out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
    with SessionDB(pg_database) as db:
        assert sorted(m["content"] for m in db.get_messages("s")) == [f"opened by {k}" for k in range(3)]
    assert migrations.current(pg_database) == HEAD


# ---------------------------------------------------------------------- the sharing proof

WORKER = r"""
import json, sys
from hermes_store import SessionDB, errors
url, tenant, me, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
MARK = {"team_a": ("alphaword", "甲"), "team_b": ("betaword", "乙")}
word, cjk = MARK[tenant]
other_word, other_cjk = next(v for k, v in MARK.items() if k != tenant)
db = SessionDB(url, schema=tenant)  # every process opens (and migrates) at once
for sid in ("shared", f"own-{me}", f"flag-{me}"):
    db.ensure_session(sid, "cli")
violations, searches, contested = [], 0, False
for i in range(n):
    db.append_message("shared", "user", f"{word} {me} {i}", tool_calls=[{"id": i}] if i % 3 == 0 else None)
    db.append_message(f"own-{me}", "assistant", f"共有{cjk}テキスト{me}-{i}")
    if i % 10 == 0:
        db.update_token_counts("shared", input_tokens=1)
        if db.get_session(f"own-{me}") is None:
            violations.append(f"own-{me} was not found after {i} appends")
        foreign = [m["content"] for m in db.get_messages(f"own-{me}") if other_cjk in (m["content"] or "")]
        if foreign:
            violations.append(f"read {len(foreign)} rows of the other tenant")
    if i % 20 == 0:
        db.set_session_title(f"own-{me}", f"Title {me} {i}")  # the same titles in both tenants
    if i == n // 2:
        try:
            db.set_session_title(f"flag-{me}", "Contested")
            contested = True
        except errors.TitleConflictError:
            pass
    if i % 15 == 0:
        for query, mine, theirs in ((word, word, other_word), ("共有", cjk, other_cjk), (other_word, None, None)):
            hits = db.search_messages(query, limit=50)
            searches += 1
            if mine is None:
                if hits:
                    violations.append(f"{query!r} found {len(hits)} rows of the other tenant")
                continue
            if not hits:
                violations.append(f"{query!r} found nothing of our own")
            for h in hits:
                text = json.dumps(h, ensure_ascii=False)
                if theirs in text or mine not in text:
                    violations.append(f"{query!r} returned {text}")
db.close()
print(json.dumps({"violations": violations[:20], "searches": searches, "contested": contested}))
"""


def test_four_processes_two_tenants_share_one_database(pg_database: str, plain: Engine) -> None:
    """Two tenants, two writers each, on one fresh database: every process opens its
    tenant at once (concurrent first migrations of one schema and of the shared
    extension), then appends, titles and searches. At the end every row is in its
    tenant, counters are exact, and no search ever returned the other tenant's rows."""
    two_tenants_two_writers(pg_database, plain)


def two_tenants_two_writers(url: str, plain: Engine, per: int = 120) -> None:
    """THE sharing proof, on ``url`` (direct or through a pooler); ``plain`` reads the
    server directly to check where every row landed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    workers = [(tenant, me) for tenant in ("team_a", "team_b") for me in ("0", "1")]
    running = [
        subprocess.Popen([sys.executable, "-c", WORKER, url, tenant, me, str(per)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for tenant, me in workers
    ]
    reports = {}
    for (tenant, me), proc in zip(workers, running, strict=True):
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err
        reports[tenant, me] = json.loads(out.strip().splitlines()[-1])
    for key, report in reports.items():
        assert report["violations"] == [], (key, report["violations"])
        assert report["searches"] == 3 * len(range(0, per, 15))
    marks = {"team_a": ("alphaword", "甲"), "team_b": ("betaword", "乙")}
    for tenant, (word, cjk) in marks.items():
        other_word, other_cjk = marks["team_b" if tenant == "team_a" else "team_a"]
        with SessionDB(url, schema=tenant) as db:
            assert db.session_count() == 5  # shared, own-0, own-1, flag-0, flag-1
            shared = db.get_session("shared")
            assert db.message_count("shared") == 2 * per == shared["message_count"]
            assert shared["tool_call_count"] == 2 * len(range(0, per, 3))
            assert shared["input_tokens"] == 2 * len(range(0, per, 10))
            assert {m["content"] for m in db.get_messages("shared")} == {
                f"{word} {me} {i}" for me in ("0", "1") for i in range(per)}
            for me in ("0", "1"):
                own = db.get_session(f"own-{me}")
                assert own["message_count"] == per == db.message_count(f"own-{me}")
                assert {m["content"] for m in db.get_messages(f"own-{me}")} == {
                    f"共有{cjk}テキスト{me}-{i}" for i in range(per)}
                assert db.get_session_title(f"own-{me}") == f"Title {me} {max(range(0, per, 20))}"
            # Exactly one writer of each tenant got the contested title: unique per tenant.
            assert [reports[tenant, me]["contested"] for me in ("0", "1")].count(True) == 1
            assert db.get_session_by_title("Contested")["id"] in {"flag-0", "flag-1"}
            assert db.message_count() == 4 * per
            assert db.search_messages(other_word) == [] and db.search_messages(other_cjk) == []
    with plain.connect() as conn:
        assert objects_in(conn, "public") == set()
        for tenant in marks:
            word = marks[tenant][0]
            other_word = marks["team_b" if tenant == "team_a" else "team_a"][0]
            # Not one row landed in the other tenant's schema.
            assert conn.execute(text(f"SELECT count(*) FROM {tenant}.messages WHERE content LIKE :w"),
                                {"w": f"%{other_word}%"}).scalar() == 0
            assert conn.execute(text(f"SELECT count(*) FROM {tenant}.sessions")).scalar() == 5
            assert conn.exec_driver_sql(f"SELECT count(*) FROM {tenant}.messages").scalar() == 4 * per
            assert conn.exec_driver_sql(f"SELECT version_num FROM {tenant}.hermes_store_version").all() == [(HEAD,)]
        assert conn.exec_driver_sql("SELECT count(*) FROM pg_extension WHERE extname = 'pg_trgm'").scalar() == 1
