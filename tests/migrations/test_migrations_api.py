"""The migration API on both backends: ``migrations.upgrade/downgrade/current/stamp``
on a SQLite file and on a PostgreSQL database, with the same answers.

What a database is at and how it gets there: a new database has no revision; upgrade
goes forward only and refuses to go back; up, down and up again gives the same schema;
an unknown revision, a foreign schema and revisions a host's Alembic runs are refused
with typed errors and nothing changed; a revision that fails or whose process is killed
leaves the previous one; targets may be paths, URLs, Engines or a caller's Connection
(inside its transaction); ``alembic check`` and autogenerate are quiet; our version
table is our own, and a host can run our revisions as a branch of its own.

Hermes' SQLite history (exact schemas per revision, data and FTS through every step,
batch rebuilds) is in test_migrations.py; PostgreSQL's own schema (types, search
objects, what ``downgrade base`` leaves) is in test_pg_migrations.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine as sa_create_engine, event, inspect, text

from hermes_store import SessionDB, UnitOfWork, errors, migrations, paths
from hermes_store.engine import create_engine

from ..helpers import REPO, sha, snap

pytestmark = pytest.mark.both_backends

ORDER = paths.revision_order()
HEAD = paths.head()
BEFORE_HEAD = ORDER[-2]
#: Newest Hermes schema version the chain reproduces (ids of Hermes' revisions are numbers).
NEWEST_HERMES = max(int(r) for r in ORDER if r.isdigit())
#: Our own revisions after Hermes' history (the PostgreSQL baseline and what follows it).
OWN_TAIL = ORDER[ORDER.index(f"{NEWEST_HERMES:04d}") + 1:]


@pytest.fixture
def target(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A database that holds nothing yet: a SQLite file path (not created) or a fresh server database URL."""
    if backend == "postgresql":
        return request.getfixturevalue("pg_database")
    return str(tmp_path / "state.db")


def url_of(target: str) -> str:
    return target if "://" in target else f"sqlite:///{target}"


def is_file(target: str) -> bool:
    return "://" not in target


@pytest.fixture
def plain_engine(target: str) -> Iterator[Engine]:
    """A host application's own engine: plain SQLAlchemy, none of our hooks."""
    engine = sa_create_engine(url_of(target))
    yield engine
    engine.dispose()


def query(target: str, sql: str, **params: Any) -> list[tuple]:
    engine = sa_create_engine(url_of(target))
    try:
        with engine.begin() as conn:
            result = conn.execute(text(sql), params)
            return [tuple(r) for r in result] if result.returns_rows else []
    finally:
        engine.dispose()


def tables(target: str) -> set[str]:
    engine = sa_create_engine(url_of(target))
    try:
        with engine.connect() as conn:
            return set(inspect(conn).get_table_names())
    finally:
        engine.dispose()


def schema(target: str, skip: frozenset[str] = frozenset()) -> dict:
    """Every object of the database, normalized, to compare two moments of one database.

    SQLite: the normalized snapshot (tables, columns, indexes, triggers, views, FTS5).
    PostgreSQL: from the catalogs, the columns with their types, defaults and
    generation, indexes, triggers, functions and views of the current schema.
    """
    if is_file(target):
        if not Path(target).exists():
            return {}
        live = snap(Path(target))
        for name in skip:
            live["tables"].pop(name, None)
        return live
    engine = sa_create_engine(target)
    try:
        with engine.connect() as conn:
            cols = conn.execute(text(
                "SELECT table_name, column_name, data_type, is_nullable, column_default, is_generated,"
                " generation_expression, is_identity FROM information_schema.columns"
                " WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position")).all()
            idx = conn.execute(text(
                "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()")).all()
            trig = conn.execute(text(
                "SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t"
                " JOIN pg_class c ON c.oid = t.tgrelid WHERE NOT t.tgisinternal")).all()
            funcs = conn.execute(text(
                "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p"
                " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = current_schema()"
                " AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')")).all()
            views = conn.execute(text(
                "SELECT viewname, definition FROM pg_views WHERE schemaname = current_schema()")).all()
    finally:
        engine.dispose()
    return {
        "columns": sorted(tuple(r) for r in cols if r[0] not in skip),
        "indexes": sorted(tuple(r) for r in idx if r[0] not in skip),
        "triggers": sorted(tuple(r) for r in trig if r[0] not in skip),
        "functions": sorted(tuple(r) for r in funcs),
        "views": sorted(tuple(r) for r in views),
    }


# ------------------------------------------------------------------ a new database, upgrade, current


def test_a_new_database_has_no_revision_until_upgraded(target: str) -> None:
    assert migrations.current(target) is None
    if is_file(target):
        assert not Path(target).exists()  # asking is not a reason to create a file
    else:
        assert tables(target) == set()
    assert migrations.upgrade(target) == HEAD
    assert migrations.current(target) == HEAD
    have = tables(target)
    assert {"sessions", "messages", "state_meta", "schema_version", migrations.VERSION_TABLE} <= have
    assert "alembic_version" not in have  # a host's Alembic table is never ours
    assert query(target, f"SELECT version_num FROM {migrations.VERSION_TABLE}") == [(HEAD,)]
    assert query(target, "SELECT max(version) FROM schema_version") == [(NEWEST_HERMES,)]
    at_head = schema(target)
    assert migrations.upgrade(target) == HEAD  # at head: nothing to do
    assert schema(target) == at_head


def test_upgrade_goes_forward_step_by_step_and_never_back(target: str) -> None:
    assert migrations.upgrade(target, BEFORE_HEAD) == BEFORE_HEAD
    assert migrations.current(target) == BEFORE_HEAD
    assert migrations.upgrade(target, BEFORE_HEAD) == BEFORE_HEAD  # the revision it is at: a no-op
    assert migrations.upgrade(target, "head") == HEAD
    at_head = schema(target)
    # Alembic would do nothing; the caller asked for a schema it will not get.
    for older in (BEFORE_HEAD, ORDER[0]):
        with pytest.raises(errors.InvalidInputError, match=f"cannot go back to {older}"):
            migrations.upgrade(target, older)
    assert migrations.current(target) == HEAD and schema(target) == at_head


def test_up_down_up_gives_the_same_schema(target: str) -> None:
    migrations.upgrade(target)
    at_head = schema(target)
    assert migrations.downgrade(target, BEFORE_HEAD) == BEFORE_HEAD
    assert migrations.current(target) == BEFORE_HEAD
    assert migrations.downgrade(target, "base") is None
    assert migrations.current(target) is None
    assert tables(target) <= {migrations.VERSION_TABLE}  # only Alembic's (empty) table is left
    assert migrations.upgrade(target) == HEAD
    assert schema(target) == at_head


def test_stamp_records_a_revision_without_running_it(target: str) -> None:
    migrations.stamp(target, HEAD)
    assert migrations.current(target) == HEAD
    assert "sessions" not in tables(target)
    assert migrations.upgrade(target) == HEAD  # stamped at head: there is nothing left to run
    assert "sessions" not in tables(target)
    migrations.stamp(target, "base")
    assert migrations.current(target) is None
    assert migrations.upgrade(target) == HEAD and "sessions" in tables(target)


# ------------------------------------------------------------------ refusals


def test_an_unknown_revision_is_refused_untouched(target: str) -> None:
    """A newer hermes_store wrote it: neither upgrade nor downgrade may guess."""
    migrations.upgrade(target)
    query(target, f"UPDATE {migrations.VERSION_TABLE} SET version_num = '0999'")
    before = schema(target)
    digest = sha(Path(target)) if is_file(target) else None
    with pytest.raises(errors.SchemaTooNewError, match="0999"):
        migrations.upgrade(target)
    with pytest.raises(errors.SchemaTooNewError, match="0999"):
        migrations.downgrade(target, BEFORE_HEAD)
    assert migrations.current(target) == "0999" and schema(target) == before
    if digest is not None:
        assert sha(Path(target)) == digest


def test_a_foreign_schema_is_refused_untouched(target: str) -> None:
    """A sessions table that is neither Hermes' nor ours is somebody else's data."""
    query(target, "CREATE TABLE sessions (id TEXT PRIMARY KEY, owner TEXT)")
    query(target, "INSERT INTO sessions VALUES ('x', 'them')")
    before = schema(target)
    with pytest.raises(errors.NotAHermesDatabaseError, match="foreign schema"):
        migrations.upgrade(target)
    with pytest.raises(errors.NotAHermesDatabaseError):
        migrations.downgrade(target, "base")
    assert schema(target) == before and tables(target) == {"sessions"}
    assert query(target, "SELECT id, owner FROM sessions") == [("x", "them")]


def test_an_unmigrated_database_names_the_fix(target: str) -> None:
    engine = create_engine(target)
    try:
        with pytest.raises(errors.NotMigratedError, match=r"migrations\.upgrade"):
            with UnitOfWork(engine) as uow:
                uow.sessions.create("s1", "cli")
    finally:
        engine.dispose()
    assert migrations.current(target) is None
    # Whatever the failed write left (SQLite may have made an empty file), upgrade takes it as new.
    assert migrations.upgrade(target) == HEAD
    engine = create_engine(target)
    try:
        with UnitOfWork(engine) as uow:
            uow.sessions.create("s1", "cli")
        with UnitOfWork(engine, write=False) as uow:
            assert uow.sessions.get("s1")["source"] == "cli"
    finally:
        engine.dispose()


def test_our_revisions_in_a_host_version_table_are_left_to_the_host(target: str) -> None:
    """Branch mode: a host's Alembic records our revisions in *its* table; our tools
    recognize them, and leave migrating to the host."""
    assert migrations.upgrade(target, BEFORE_HEAD, version_table="alembic_version") == BEFORE_HEAD
    assert migrations.current(target) == BEFORE_HEAD  # found in the host's table
    assert migrations.VERSION_TABLE not in tables(target)
    before = schema(target)
    with pytest.raises(errors.ManagedByHostError, match="alembic upgrade heads"):
        migrations.upgrade(target)
    with pytest.raises(errors.ManagedByHostError):
        migrations.downgrade(target, "base")
    with pytest.raises(errors.ManagedByHostError):
        SessionDB(target)
    assert schema(target) == before and migrations.VERSION_TABLE not in tables(target)
    assert migrations.upgrade(target, BEFORE_HEAD) == BEFORE_HEAD  # already where asked: fine
    # The host migrates; at head our tools use the database as it is.
    assert migrations.upgrade(target, version_table="alembic_version") == HEAD
    assert migrations.upgrade(target) == HEAD
    with SessionDB(target) as db:
        db.create_session("s1", "cli")
        db.append_message("s1", "user", "kubernetes rollout from the host app")
        assert [h["session_id"] for h in db.search_messages("kubernetes")] == ["s1"]
    assert migrations.VERSION_TABLE not in tables(target)
    assert query(target, "SELECT version_num FROM alembic_version") == [(HEAD,)]


@pytest.mark.parametrize("url", ["mysql+pymysql://u:p@localhost/db", "oracle://u:p@host/db", "mssql+pyodbc://u:p@dsn"])
def test_other_dialects_are_refused_before_connecting(url: str) -> None:
    """Refused by name before a driver is imported (none of these is installed)."""
    with pytest.raises(errors.UnsupportedDatabaseError, match="SQLite or PostgreSQL"):
        migrations.upgrade(url)
    with pytest.raises(errors.UnsupportedDatabaseError):
        migrations.current(url)
    with pytest.raises(errors.UnsupportedDatabaseError):
        migrations.downgrade(url, "base")
    with pytest.raises(errors.UnsupportedDatabaseError):
        migrations.stamp(url, "head")


def test_a_server_that_cannot_be_reached_is_a_typed_error() -> None:
    """PostgreSQL only, and no server needed: nothing listens on port 1."""
    url = "postgresql+psycopg://u:secret@127.0.0.1:1/db"
    calls = [lambda: migrations.current(url), lambda: migrations.upgrade(url), lambda: migrations.stamp(url, "head"),
             lambda: migrations.downgrade(url, "base")]
    host = sa_create_engine(url)  # a host's own engine, without our error hooks
    calls.append(lambda: migrations.upgrade(host))
    try:
        for call in calls:
            with pytest.raises(errors.DatabaseUnavailableError) as info:
                call()
            assert "Connection refused" in str(info.value) and "secret" not in str(info.value)
    finally:
        host.dispose()


# ------------------------------------------------------------------ targets: engines and a caller's connection


def test_upgrade_on_an_engine(target: str, plain_engine: Engine) -> None:
    assert migrations.upgrade(plain_engine, BEFORE_HEAD) == BEFORE_HEAD
    assert migrations.upgrade(plain_engine) == HEAD
    assert migrations.current(plain_engine) == HEAD
    assert migrations.downgrade(plain_engine, BEFORE_HEAD) == BEFORE_HEAD
    assert migrations.current(target) == BEFORE_HEAD  # committed, seen from elsewhere


@pytest.mark.parametrize("end", ["commit", "rollback"])
def test_upgrade_inside_the_callers_transaction(target: str, plain_engine: Engine, end: str) -> None:
    """Given a Connection, migrations run inside the caller's transaction: commit keeps
    both the caller's write and our schema, rollback keeps neither."""
    with plain_engine.begin() as conn:
        conn.execute(text("CREATE TABLE audit (what TEXT)"))
    with plain_engine.connect() as conn:
        conn.execute(text("INSERT INTO audit VALUES ('hermes_store installed')"))
        assert migrations.upgrade(conn) == HEAD
        assert conn.in_transaction()
        assert migrations.current(conn) == HEAD
        assert conn.in_transaction()  # looking did not end the caller's transaction
        getattr(conn, end)()
    rows = query(target, "SELECT what FROM audit")
    if end == "rollback":
        assert rows == [] and tables(target) == {"audit"}
        assert migrations.current(target) is None
        return
    assert rows == [("hermes_store installed",)]
    assert migrations.current(target) == HEAD
    # The same schema as an upgrade of our own would give.
    through_host = schema(target, skip=frozenset({"audit"}))
    migrations.downgrade(target, "base")
    migrations.upgrade(target)
    assert schema(target, skip=frozenset({"audit"})) == through_host


# ------------------------------------------------------------------ atomicity


def failing_engine(target: str, pattern: str) -> Engine:
    """Our engine, whose statement matching ``pattern`` fails as if the disk or the network gave up."""
    engine = create_engine(target, foreign_keys=False)

    @event.listens_for(engine, "before_cursor_execute")
    def _boom(conn, cursor, statement, *args):
        if re.search(pattern, statement):
            raise RuntimeError(f"injected failure at: {statement[:60]}")

    return engine


#: The last statement of a revision's transaction: Alembic moving the version on.
VERSION_BUMP = rf"^UPDATE {migrations.VERSION_TABLE} SET version_num"


@pytest.mark.parametrize("revision", OWN_TAIL)
def test_a_failed_revision_leaves_the_previous_one(target: str, revision: str) -> None:
    """Everything the revision did is rolled back with it (each revision is one transaction)."""
    previous = ORDER[ORDER.index(revision) - 1]
    migrations.upgrade(target, previous)
    before = schema(target)
    engine = failing_engine(target, VERSION_BUMP)
    try:
        with pytest.raises(RuntimeError, match="injected failure"):
            migrations.upgrade(engine, revision)
    finally:
        engine.dispose()
    assert migrations.current(target) == previous and schema(target) == before
    assert migrations.upgrade(target, revision) == revision  # and then it applies cleanly


def test_a_killed_process_leaves_the_previous_revision(target: str) -> None:
    migrations.upgrade(target, BEFORE_HEAD)
    before = schema(target)
    code = textwrap.dedent(
        f"""
        import os, re
        from sqlalchemy import event
        from hermes_store import migrations
        from hermes_store.engine import create_engine
        engine = create_engine({target!r}, foreign_keys=False)
        @event.listens_for(engine, "before_cursor_execute")
        def _kill(conn, cursor, statement, *a):
            if re.search({VERSION_BUMP!r}, statement):
                os._exit(9)
        migrations.upgrade(engine)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 9, proc.stderr
    assert migrations.current(target) == BEFORE_HEAD and schema(target) == before
    assert migrations.upgrade(target) == HEAD


# ------------------------------------------------------------------ Alembic: autogenerate, its command line, a host's branch


def test_alembic_check_and_autogenerate_are_quiet(target: str, tmp_path: Path) -> None:
    migrations.upgrade(target)
    cfg = migrations.make_config(url_of(target))
    command.check(cfg)  # raises AutogenerateDiffsDetected on any difference
    # A contributor's `alembic revision --autogenerate` on unchanged models: empty.
    scripts = tmp_path / "scripts"
    shutil.copytree(migrations.script_location(), scripts, ignore=shutil.ignore_patterns("__pycache__"))
    cfg.set_main_option("script_location", str(scripts))
    command.revision(cfg, message="nothing", autogenerate=True, rev_id="9999")
    (made,) = (scripts / "versions").glob("*_nothing.py")  # the id may follow our own namespace
    generated = made.read_text()
    bodies = re.findall(r"def (?:up|down)grade\(\) -> None:\n(.*?)(?=\n\n\ndef |\Z)", generated, re.S)
    assert len(bodies) == 2
    # Our template may install the batch hooks first; anything else would be a diff.
    hook = "keep_triggers_across_batch(op.get_bind())"
    for body in bodies:
        code = [line.strip() for line in body.splitlines()
                if line.strip() and not line.strip().startswith("#") and line.strip() != hook]
        assert code == ["pass"], generated


@pytest.mark.parametrize("hook", ["include_name", "include_object"])
def test_host_hooks_leave_only_the_hosts_table_to_autogenerate(target: str, hook: str) -> None:
    """What a host's branch-mode env.py gets from alembic_support, with README's list of
    MetaData: our FTS / search machinery hidden, no NULL-able key "changes" of ours (which
    PostgreSQL proposes without the hook and then refuses), the host's own changes kept."""
    from alembic.autogenerate import produce_migrations
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import Column, Integer, MetaData, Table

    from hermes_store import alembic_support
    from hermes_store.models import metadata

    migrations.upgrade(target)
    query(target, "CREATE TABLE host_gone (id INTEGER PRIMARY KEY)")  # the host dropped its model
    host = MetaData()
    Table("host_notes", host, Column("id", Integer, primary_key=True))
    target_metadata = [host, metadata]
    engine = sa_create_engine(url_of(target))
    try:
        with engine.connect() as conn, alembic_support.quiet_reflection():
            opts: dict[str, Any] = {"target_metadata": target_metadata, "compare_type": True,
                                    hook: getattr(alembic_support, hook)}
            script = produce_migrations(MigrationContext.configure(conn, opts=opts), target_metadata)
            raw = _flat(script.upgrade_ops.as_diffs())
            alembic_support.keep_our_keys(MigrationContext.configure(conn, opts=opts), None, [script])
            kept = _flat(script.upgrade_ops.as_diffs())
            reverse = _flat(script.downgrade_ops.as_diffs())
    finally:
        engine.dispose()
    nullable = [(d[2], d[3]) for d in raw if d[0] == "modify_nullable"]
    if is_file(target):
        assert nullable == []  # SQLite: the DDL's keys hold NULL too
    else:
        assert len(nullable) >= 9 and set(nullable) <= alembic_support._nullable_key_columns(), raw
    assert sorted((d[0], d[1].name) for d in kept) == [("add_table", "host_notes"), ("remove_table", "host_gone")]
    assert sorted(d[0] for d in reverse) == ["add_table", "remove_table"]
    # The former name took only one MetaData; it is the same hook now.
    assert alembic_support.drop_sqlite_nullable_keys is alembic_support.keep_our_keys


def _flat(diffs: list) -> list[tuple]:
    """``as_diffs()`` with a table's column changes (a nested list) taken out of their list."""
    return [item for d in diffs for item in (d if isinstance(d, list) else [d])]


def test_alembic_command_line_upgrades_checks_and_keeps_to_its_own_version_table(target: str, tmp_path: Path) -> None:
    """The alembic command line, from the repo's alembic.ini ($HERMES_STORE_URL names the
    database), then on a database a host shares: the host's version table is left alone."""
    alembic_bin = Path(sys.executable).with_name("alembic")
    env = {**os.environ, "HERMES_STORE_URL": url_of(target)}

    def alembic(*args: str) -> str:
        out = subprocess.run([str(alembic_bin), "-c", str(REPO / "alembic.ini"), *args],
                             capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
        assert out.returncode == 0, out.stderr
        return out.stdout + out.stderr

    alembic("upgrade", "head")
    assert migrations.current(target) == HEAD
    assert "No new upgrade operations detected" in alembic("check")
    query(target, "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
    query(target, "INSERT INTO alembic_version VALUES ('hostrev')")
    assert HEAD in alembic("current")
    alembic("upgrade", "head")
    assert query(target, "SELECT version_num FROM alembic_version") == [("hostrev",)]
    assert query(target, f"SELECT version_num FROM {migrations.VERSION_TABLE}") == [(HEAD,)]
    # The host's version table is not ours: check stays quiet instead of proposing to drop it.
    assert "No new upgrade operations detected" in alembic("check")


def test_host_runs_our_versions_as_a_separate_branch(target: str, tmp_path: Path) -> None:
    """The README's second integration: our versions/ in a host's version_locations."""
    host = tmp_path / "host"
    (host / "versions").mkdir(parents=True)
    (host / "env.py").write_text(textwrap.dedent(
        """
        from alembic import context
        from sqlalchemy import create_engine
        from hermes_store.engine import install_begin_hook

        engine = create_engine(context.config.get_main_option("sqlalchemy.url"))
        with engine.connect() as conn:
            install_begin_hook(conn)
            context.configure(connection=conn, target_metadata=None, transactional_ddl=True,
                              transaction_per_migration=True)
            with context.begin_transaction():
                context.run_migrations()
            conn.commit()
        engine.dispose()
        """
    ))
    (host / "script.py.mako").write_text((migrations.script_location() / "script.py.mako").read_text())
    (host / "versions" / "h001_app.py").write_text(textwrap.dedent(
        f'''
        """Host app table that needs hermes_store's sessions."""
        from alembic import op
        revision = "h001"
        down_revision = None
        branch_labels = ("app",)
        depends_on = "{HEAD}"

        def upgrade():
            op.execute("CREATE TABLE app_notes (session_id TEXT REFERENCES sessions(id), note TEXT)")

        def downgrade():
            op.execute("DROP TABLE app_notes")
        '''
    ))
    cfg = Config()
    cfg.set_main_option("script_location", str(host))
    cfg.set_main_option("version_locations", f"{host / 'versions'} {migrations.versions_location()}")
    cfg.set_main_option("path_separator", "space")
    cfg.set_main_option("sqlalchemy.url", url_of(target))
    command.upgrade(cfg, "heads")
    assert query(target, "SELECT version_num FROM alembic_version") == [("h001",)]  # ours: a dependency of h001
    assert query(target, "SELECT max(version) FROM schema_version") == [(NEWEST_HERMES,)]
    assert {"app_notes", "sessions", "messages"} <= tables(target)
    assert migrations.VERSION_TABLE not in tables(target)
    command.downgrade(cfg, "base")
    assert not {"sessions", "app_notes", "messages", "schema_version"} & tables(target)
