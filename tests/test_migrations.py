"""The revision chain: exact Hermes schemas, reversibility, data survival, atomicity.

These are pytest-alembic style checks written against our own programmatic API, plus
snapshots of what autogenerate cannot see (triggers, virtual tables, views).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import produce_migrations
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import event

from hermes_store import errors, introspect, migrations
from hermes_store.alembic_support import foreign_names, make_include_name
from hermes_store.engine import create_engine
from hermes_store.models import metadata

from .conftest import SCHEMA_DIR, integrity_check, reference_schema, rev, sha, snap

SCRIPT = ScriptDirectory.from_config(migrations.make_config())
HEAD = SCRIPT.get_current_head()
HEAD_N = int(HEAD)
ALL_N = list(range(1, HEAD_N + 1))
#: Revisions that reproduce a Hermes schema version; later ones are hermes_store's own.
HERMES_N = [n for n in ALL_N if n <= 23]


def expected_schema(n: int) -> dict:
    """Hermes' reference for 1..23; our golden snapshot for our own revisions."""
    return reference_schema(n) if n <= 23 else json.loads((OWN_SCHEMA_DIR / f"{n:04d}.json").read_text())
REPO = Path(__file__).resolve().parent.parent
#: Golden snapshots of our own revisions (what autogenerate cannot see: triggers too).
OWN_SCHEMA_DIR = Path(__file__).parent / "data" / "own_schema"






def test_single_linear_head() -> None:
    assert SCRIPT.get_heads() == [HEAD]
    revs = [s.revision for s in SCRIPT.walk_revisions("base", "heads")]
    assert revs == [rev(n) for n in range(HEAD_N, 0, -1)]
    assert HEAD_N >= 11


@pytest.mark.parametrize("n", ALL_N)
def test_upgrade_gives_exact_hermes_schema(n: int, migrate, db_path: Path) -> None:
    migrate(rev(n))
    live = snap(db_path)
    assert introspect.diff(expected_schema(n), live) == []
    assert live["schema_version"] == min(n, 23)  # our own revisions keep Hermes' version
    assert migrations.current(db_path) == rev(n)


def test_every_revision_has_a_reference_json() -> None:
    for n in HERMES_N:
        assert (SCHEMA_DIR / f"hermes_v{n}.json").is_file()
    for n in ALL_N[len(HERMES_N):]:
        assert (OWN_SCHEMA_DIR / f"{n:04d}.json").is_file()


def test_own_revisions_only_add_to_hermes_v23() -> None:
    """Our revisions after 0023 add objects; everything Hermes v23 has stays identical."""
    ours = expected_schema(HEAD_N)
    problems = introspect.diff(reference_schema(23), ours)
    assert problems and all(p.startswith(("extra ",)) for p in problems), problems


@pytest.mark.parametrize("n", ALL_N)
def test_downgrade_one_step_gives_previous_schema(n: int, migrate, db_path: Path) -> None:
    migrate(rev(n))
    target = rev(n - 1) if n > 1 else "base"
    migrations.downgrade(db_path, target)
    live = snap(db_path)
    if n == 1:
        assert live["tables"] == {} and live["virtual"] == {} and live["triggers"] == {}
        assert migrations.current(db_path) is None
    else:
        assert introspect.diff(expected_schema(n - 1), live) == []


def test_up_down_up_empty(migrate, db_path: Path) -> None:
    migrate("head")
    first = snap(db_path)
    migrations.downgrade(db_path, "base")
    assert snap(db_path)["tables"] == {}
    migrations.upgrade(db_path, "head")
    assert snap(db_path) == first


# --------------------------------------------------------------------- data survival

SESSIONS = [
    ("s_root", "cli", 1000.0),
    ("s_child", "cli", 2000.0),
    ("s_other", "telegram", 3000.0),
]
MESSAGES = [
    # (session, role, content, tool_name, tool_calls)
    ("s_root", "user", "please deploy the zebrafish pipeline", None, None),
    ("s_root", "assistant", None, None, '[{"function": {"name": "terminal", "arguments": "{\\"cmd\\": \\"kubectl rollout quokka\\"}"}}]'),
    ("s_root", "tool", "rollout finished ocelot", "terminal", None),
    ("s_child", "user", "数据库迁移测试 continues", None, None),
    ("s_child", "assistant", "summary of marmot findings", None, None),
    ("s_other", "user", "hello wombat", None, None),
]


def seed_v1(conn: sqlite3.Connection) -> None:
    for sid, source, started in SESSIONS:
        parent = "s_root" if sid == "s_child" else None
        conn.execute(
            "INSERT INTO sessions (id, source, started_at, parent_session_id, input_tokens) VALUES (?, ?, ?, ?, 7)",
            (sid, source, started, parent),
        )
    for i, (sid, role, content, tool_name, tool_calls) in enumerate(MESSAGES):
        conn.execute(
            "INSERT INTO messages (session_id, role, content, tool_name, tool_calls, timestamp) VALUES (?, ?, ?, ?, ?, ?)",
            (sid, role, content, tool_name, tool_calls, 5000.0 + i),
        )


def fts_find(conn: sqlite3.Connection, table: str, term: str) -> set[int]:
    return {r[0] for r in conn.execute(f"SELECT rowid FROM {table} WHERE {table} MATCH ?", (term,))}


def exercise_triggers(conn: sqlite3.Connection, step: int) -> None:
    """Insert, update and delete through the triggers of the current revision."""
    conn.execute("BEGIN")
    cur = conn.execute(
        "INSERT INTO messages (session_id, role, content, timestamp) VALUES ('s_other', 'user', ?, ?)",
        (f"transient capybara{step}", 9000.0 + step),
    )
    new_id = cur.lastrowid
    conn.execute("UPDATE messages SET content = ? WHERE id = ?", (f"edited narwhal{step}", new_id))
    assert fts_find(conn, "messages_fts", f"narwhal{step}") == {new_id}
    assert fts_find(conn, "messages_fts", f"capybara{step}") == set()
    conn.execute("DELETE FROM messages WHERE id = ?", (new_id,))
    assert fts_find(conn, "messages_fts", f"narwhal{step}") == set()
    integrity_check(conn)
    conn.execute("COMMIT")


def test_rows_survive_every_step_and_fts_stays_in_sync(migrate, db_path: Path, raw) -> None:
    migrate("0001")
    conn = raw()
    seed_v1(conn)
    before_sessions = conn.execute("SELECT id, source, started_at, parent_session_id FROM sessions ORDER BY id").fetchall()
    before_messages = conn.execute(
        "SELECT id, session_id, role, content, tool_name, tool_calls, timestamp FROM messages ORDER BY id"
    ).fetchall()
    conn.close()
    for n in range(1, HEAD_N + 1):
        migrate(rev(n))
        conn = raw()
        assert conn.execute(
            "SELECT id, source, started_at, parent_session_id FROM sessions ORDER BY id"
        ).fetchall() == before_sessions
        assert conn.execute(
            "SELECT id, session_id, role, content, tool_name, tool_calls, timestamp FROM messages ORDER BY id"
        ).fetchall() == before_messages
        exercise_triggers(conn, n)
        if n == 11:
            # v11: both inline indexes hold content, tool name and tool-call arguments.
            ids = {r[0]: r for r in before_messages}
            for table in ("messages_fts", "messages_fts_trigram"):
                assert fts_find(conn, table, "zebrafish") == {1}
                assert fts_find(conn, table, "quokka") == {2}  # tool-call arguments
                assert fts_find(conn, table, "terminal") == {2, 3}  # tool name + arguments
                assert fts_find(conn, table, "ocelot") == {3}
                assert fts_find(conn, table, "marmot") == {5}
            assert fts_find(conn, "messages_fts_trigram", "数据库迁移") == {4}
            indexed = {r[0] for r in conn.execute("SELECT rowid FROM messages_fts")}
            assert indexed == set(ids)
        conn.close()


def test_up_down_up_with_data(migrate, db_path: Path, raw) -> None:
    migrate("0001")
    conn = raw()
    seed_v1(conn)
    conn.close()
    migrate("head")
    migrations.downgrade(db_path, "0001")
    conn = raw()
    assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == len(MESSAGES)
    assert fts_find(conn, "messages_fts", "zebrafish") == {1}
    integrity_check(conn)
    conn.close()
    migrations.upgrade(db_path, "head")
    conn = raw()
    assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == len(SESSIONS)
    assert fts_find(conn, "messages_fts", "wombat") == {6}
    integrity_check(conn)
    conn.close()
    migrations.downgrade(db_path, "base")
    migrations.upgrade(db_path, "head")
    assert introspect.diff(expected_schema(HEAD_N), snap(db_path)) == []


# --------------------------------------------------------------------- atomicity


def failing_engine(path: Path, pattern: str):
    """An engine whose statement matching ``pattern`` fails, as if the disk gave up."""
    engine = create_engine(path, foreign_keys=False)

    @event.listens_for(engine, "before_cursor_execute")
    def _boom(conn, cursor, statement, *args):  # noqa: ANN001
        if re.search(pattern, statement):
            raise RuntimeError(f"injected failure at: {statement[:60]}")

    return engine


@pytest.mark.parametrize(
    "start, target, pattern",
    [
        (None, "0001", r"CREATE INDEX idx_messages_session"),
        ("0004", "0005", r"ADD COLUMN cost_status"),
        ("0010", "0011", r"ADD COLUMN handoff_platform"),
        ("0009", "0010", r"UPDATE hermes_store_version"),
    ],
)
def test_failed_revision_leaves_previous_revision(start, target, pattern, migrate, db_path: Path, raw) -> None:
    if start:
        migrate("0001")
        conn = raw()
        seed_v1(conn)
        conn.close()
        migrate(start)
    else:
        fresh = sqlite3.connect(db_path)
        fresh.execute("PRAGMA user_version = 0")  # an empty database with a header
        fresh.close()
    before = snap(db_path)
    engine = failing_engine(db_path, pattern)
    with pytest.raises(RuntimeError, match="injected failure"):
        migrations.upgrade(engine, target)
    engine.dispose()
    assert snap(db_path) == before
    assert migrations.current(db_path) == start
    if start:
        conn = raw()
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == len(MESSAGES)
        integrity_check(conn)
        conn.close()
    # and the same revision then applies cleanly
    migrations.upgrade(db_path, target)
    assert migrations.current(db_path) == target


def test_process_killed_midway_leaves_previous_revision(migrate, db_path: Path, raw) -> None:
    migrate("0001")
    conn = raw()
    seed_v1(conn)
    conn.close()
    migrate("0010")
    before = snap(db_path)
    code = textwrap.dedent(
        f"""
        import os, re
        from sqlalchemy import event
        from hermes_store import migrations
        from hermes_store.engine import create_engine
        engine = create_engine({str(db_path)!r}, foreign_keys=False)
        @event.listens_for(engine, "before_cursor_execute")
        def _kill(conn, cursor, statement, *a):
            if "ADD COLUMN handoff_error" in statement:
                os._exit(9)
        migrations.upgrade(engine, "0011")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr
    assert snap(db_path) == before
    assert migrations.current(db_path) == "0010"


# --------------------------------------------------------------------- autogenerate


def test_models_match_head_ddl(head_db: Path) -> None:
    engine = create_engine(head_db)
    with engine.connect() as conn:
        ignored = foreign_names(conn)
        ctx = MigrationContext.configure(
            conn,
            opts={
                "target_metadata": metadata,
                "include_name": make_include_name(ignored, migrations.VERSION_TABLE),
                "compare_type": True,
                "version_table": migrations.VERSION_TABLE,
            },
        )
        ops = produce_migrations(ctx, metadata)
        assert ops.upgrade_ops.is_empty(), ops.upgrade_ops.as_diffs()
    engine.dispose()
    # FTS machinery is ignored, not missing: it is really there.
    assert {"messages_fts", "messages_fts_trigram"} <= ignored


def test_alembic_check_and_autogenerate_are_quiet(head_db: Path, tmp_path: Path) -> None:
    cfg = migrations.make_config(f"sqlite:///{head_db}")
    command.check(cfg)  # raises AutogenerateDiffsDetected on any difference
    # A contributor's `alembic revision --autogenerate` on unchanged models: empty.
    scripts = tmp_path / "scripts"
    shutil.copytree(migrations.script_location(), scripts, ignore=shutil.ignore_patterns("__pycache__"))
    cfg.set_main_option("script_location", str(scripts))
    command.revision(cfg, message="nothing", autogenerate=True, rev_id="9999")
    generated = next((scripts / "versions").glob("9999_*.py")).read_text()
    bodies = re.findall(r"def (?:up|down)grade\(\) -> None:\n(.*?)(?=\n\n\ndef |\Z)", generated, re.S)
    assert len(bodies) == 2
    for body in bodies:
        code = [line.strip() for line in body.splitlines() if line.strip() and not line.strip().startswith("#")]
        assert code == ["pass"], generated


def test_alembic_cli_uses_own_version_table(head_db: Path, tmp_path: Path) -> None:
    """The alembic command line, from the repo's alembic.ini, on a host-shared file."""
    conn = sqlite3.connect(head_db)
    conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
    conn.execute("INSERT INTO alembic_version VALUES ('hostrev')")
    conn.commit()
    conn.close()
    alembic_bin = Path(sys.executable).with_name("alembic")
    env = {**os.environ, "HERMES_STORE_URL": f"sqlite:///{head_db}"}
    out = subprocess.run(
        [str(alembic_bin), "-c", str(REPO / "alembic.ini"), "current"],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert HEAD in out.stdout
    conn = sqlite3.connect(head_db)
    assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [("hostrev",)]
    conn.close()


# --------------------------------------------------------------------- host connections


def test_upgrade_on_a_host_connection_inside_its_transaction(db_path: Path) -> None:
    """A host passes its own Connection (plain engine, no hooks of ours)."""
    from sqlalchemy import create_engine as sa_create_engine, text

    host = sa_create_engine(f"sqlite:///{db_path}")
    with host.connect() as conn:
        conn.execute(text("CREATE TABLE host_things (id INTEGER PRIMARY KEY)"))
        conn.commit()
        migrations.upgrade(conn, "head")
        conn.commit()
    host.dispose()
    live = snap(db_path)
    assert "host_things" in live["tables"]
    del live["tables"]["host_things"]
    assert introspect.diff(expected_schema(HEAD_N), live) == []


# --------------------------------------------------------------------- bad input


def test_missing_folder_is_refused_and_nothing_created(tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "state.db"
    with pytest.raises(errors.DatabaseUnavailableError, match="does not exist"):
        migrations.upgrade(target)
    assert not (tmp_path / "no").exists()


def test_unwritable_location_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(errors.DatabaseUnavailableError):
        migrations.upgrade(blocker / "state.db")
    assert blocker.read_text() == "x"


def test_non_sqlite_file_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 50)
    digest = sha(path)
    with pytest.raises(errors.NotADatabaseError):
        migrations.upgrade(path)
    assert sha(path) == digest


def test_unknown_revision_is_refused_untouched(head_db: Path) -> None:
    conn = sqlite3.connect(head_db)
    conn.execute(f"UPDATE {migrations.VERSION_TABLE} SET version_num = '0999'")
    conn.commit()
    conn.close()
    digest = sha(head_db)
    with pytest.raises(errors.SchemaTooNewError, match="0999"):
        migrations.upgrade(head_db)
    with pytest.raises(errors.SchemaTooNewError):
        migrations.downgrade(head_db, "0001")
    assert sha(head_db) == digest


# --------------------------------------------------------------------- packaging


@pytest.mark.slow
def test_installed_wheel_migrates_outside_source_tree(tmp_path: Path) -> None:
    wheel_dir = tmp_path / "wheel"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheel_dir), str(REPO)],
        capture_output=True, text=True,
    )
    assert built.returncode == 0, built.stderr
    wheel = next(wheel_dir.glob("hermes_store-*.whl"))
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True, capture_output=True,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = textwrap.dedent(
        """
        import hermes_store, sys
        from hermes_store import migrations
        assert hermes_store.__file__.startswith(sys.argv[1]), hermes_store.__file__
        print(migrations.upgrade("fresh.db"))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run(
        [sys.executable, "-c", code, str(site)], cwd=elsewhere, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == HEAD
    assert "hermes_store_version" in {
        r[0] for r in sqlite3.connect(elsewhere / "fresh.db").execute("SELECT name FROM sqlite_master")
    }


def test_host_runs_our_versions_as_a_separate_branch(tmp_path: Path) -> None:
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
        """
    ))
    (host / "script.py.mako").write_text((migrations.script_location() / "script.py.mako").read_text())
    (host / "versions" / "h001_app.py").write_text(textwrap.dedent(
        '''
        """Host app table that needs hermes_store's sessions."""
        from alembic import op
        revision = "h001"
        down_revision = None
        branch_labels = ("app",)
        depends_on = "0024"

        def upgrade():
            op.execute("CREATE TABLE app_notes (session_id TEXT REFERENCES sessions(id), note TEXT)")

        def downgrade():
            op.execute("DROP TABLE app_notes")
        '''
    ))
    from alembic.config import Config

    db = tmp_path / "app.db"
    cfg = Config()
    cfg.set_main_option("script_location", str(host))
    cfg.set_main_option("version_locations", f"{host / 'versions'} {migrations.versions_location()}")
    cfg.set_main_option("path_separator", "space")
    cfg.set_main_option("sqlalchemy.url", f"sqlite:///{db}")
    command.upgrade(cfg, "heads")
    conn = sqlite3.connect(db)
    versions = {r[0] for r in conn.execute("SELECT version_num FROM alembic_version")}
    assert versions == {"h001"}  # Alembic records our head as a dependency of the host's
    assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == 23
    assert {"app_notes", "sessions", "messages"} <= {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    command.downgrade(cfg, "base")
    conn = sqlite3.connect(db)
    left = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert not {"sessions", "app_notes", "messages_fts"} & left
    conn.close()


def test_alembic_cli_url_resolution_order(tmp_path: Path) -> None:
    """-x url > $HERMES_STORE_URL > sqlalchemy.url in the ini > $HERMES_HOME/state.db."""
    alembic_bin = str(Path(sys.executable).with_name("alembic"))
    a, b, c = tmp_path / "a.db", tmp_path / "b.db", tmp_path / "c.db"
    migrations.upgrade(a, "0003")
    migrations.upgrade(b, "0005")
    migrations.upgrade(c, "0007")
    home = tmp_path / "home"
    home.mkdir()
    migrations.upgrade(home / "state.db", "0009")
    ini = tmp_path / "alembic.ini"
    ini.write_text((REPO / "alembic.ini").read_text().replace(
        "script_location = %(here)s/alembic", f"script_location = {REPO / 'alembic'}"
    ).replace("# sqlalchemy.url =", f"sqlalchemy.url = sqlite:///{c}"))
    bare_ini = tmp_path / "bare.ini"
    bare_ini.write_text((REPO / "alembic.ini").read_text().replace(
        "script_location = %(here)s/alembic", f"script_location = {REPO / 'alembic'}"))
    env = {k: v for k, v in os.environ.items() if k not in ("HERMES_STORE_URL", "HERMES_HOME")}

    def current(*args: str, ini_file: Path = ini, **extra: str) -> str:
        out = subprocess.run([alembic_bin, "-c", str(ini_file), *args, "current"], capture_output=True,
                             text=True, env={**env, **extra}, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()[0]

    assert current("-x", f"url=sqlite:///{a}", HERMES_STORE_URL=f"sqlite:///{b}") == "0003"
    assert current(HERMES_STORE_URL=f"sqlite:///{b}") == "0005"
    assert current() == "0007"
    assert current(ini_file=bare_ini, HERMES_HOME=str(home)) == "0009"


def _batch_rebuild_messages(db_path: Path, keep: bool) -> None:
    """What a contributor's autogenerated batch revision does to ``messages``."""
    from alembic.operations import Operations
    import sqlalchemy as sa

    from hermes_store.alembic_support import keep_triggers_across_batch
    from hermes_store.engine import install_begin_hook

    engine = create_engine(db_path, foreign_keys=False)
    with engine.connect() as conn:
        install_begin_hook(conn)
        if keep:
            keep_triggers_across_batch(conn)
        with conn.begin():
            ops = Operations(MigrationContext.configure(conn))
            with ops.batch_alter_table("messages", recreate="always") as batch:
                batch.add_column(sa.Column("contributor_note", sa.TEXT()))
    engine.dispose()


def test_batch_rebuild_keeps_fts_triggers_and_view(migrate, db_path: Path, raw) -> None:
    migrate("0001")
    conn = raw()
    seed_v1(conn)
    conn.close()
    migrate("head")
    before = snap(db_path)
    _batch_rebuild_messages(db_path, keep=True)
    after = snap(db_path)
    assert after["triggers"] == before["triggers"] and after["views"] == before["views"]
    assert after["indexes"] == before["indexes"]
    assert "contributor_note" in after["tables"]["messages"]["columns"]
    conn = raw()
    assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == len(MESSAGES)
    integrity_check(conn)  # the rebuilt table kept every rowid the indexes point at
    exercise_triggers(conn, 99)  # and the restored triggers keep them in sync
    assert fts_find(conn, "messages_fts", "zebrafish") == {1}
    conn.close()


def test_batch_rebuild_without_the_hook_loses_triggers(migrate, db_path: Path, raw) -> None:
    """The trap itself, so the test above is known to test something."""
    migrate("head")
    try:
        _batch_rebuild_messages(db_path, keep=False)
    except Exception as exc:  # SQLite refuses the rename while the trigram view names messages
        assert "messages_fts_trigram_src" in str(exc) or "view" in str(exc).lower()
        return
    assert not [t for t in snap(db_path)["triggers"] if t.startswith("messages_fts")]
