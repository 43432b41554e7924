"""A host application embeds hermes_store, exactly as README's worked examples say.

Each test builds a real host project in a temp dir (own DeclarativeBase, ``alembic
init``, its own revisions) from the code blocks of README.md, and drives the real
``alembic`` command line. So the README cannot go stale without a test failing.
"""

from __future__ import annotations

import configparser
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy import text

import hermes_store
from hermes_store import SessionDB, adopt, errors, migrations

REPO = Path(__file__).resolve().parent.parent
#: Our revision ids, oldest first.
REVISIONS = [s.revision for s in reversed(list(ScriptDirectory.from_config(migrations.make_config()).walk_revisions()))]
pytestmark = pytest.mark.slow


def readme_block(name: str) -> str:
    """The fenced block that follows ``<!-- host-example: NAME -->`` in README.md."""
    readme = (REPO / "README.md").read_text()
    m = re.search(rf"<!-- host-example: {re.escape(name)} -->\s*```\w*\n(.*?)```", readme, re.S)
    assert m, f"README.md has no host-example block {name!r}"
    return m.group(1)


def _run(host: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    # The host's modules, and the same hermes_store this test process imported.
    env["PYTHONPATH"] = os.pathsep.join([str(host), str(Path(hermes_store.__file__).resolve().parent.parent)])
    env["HERMES_HOME"] = str(host / "hermes-home")
    env.pop("HERMES_STORE_URL", None)
    return subprocess.run(list(argv), cwd=host, env=env, capture_output=True, text=True)


def _alembic(host: Path, *args: str) -> subprocess.CompletedProcess[str]:
    out = _run(host, sys.executable, "-m", "alembic", *args)
    assert out.returncode == 0, f"alembic {' '.join(args)}\n{out.stdout}\n{out.stderr}"
    return out


def make_host(tmp_path: Path, mode: str) -> Path:
    host = tmp_path / f"host-{mode}"
    (host / "hostapp").mkdir(parents=True)
    (host / "hostapp" / "__init__.py").write_text("")
    (host / "hostapp" / "models.py").write_text(readme_block("hostapp/models.py"))
    _alembic(host, "init", "alembic")
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(host / "alembic.ini")
    ini["alembic"]["sqlalchemy.url"] = "sqlite:///%(here)s/app.db"
    if mode == "branch":
        extra = configparser.ConfigParser(interpolation=None)
        extra.read_string(readme_block("branch/alembic.ini"))
        for key, value in extra["alembic"].items():
            ini["alembic"][key] = value
    with open(host / "alembic.ini", "w") as fh:
        ini.write(fh)
    (host / "alembic" / "env.py").write_text(readme_block(f"{mode}/env.py"))
    return host


def _new_revisions(host: Path) -> list[Path]:
    return sorted((host / "alembic" / "versions").glob("*.py"))


def _ops(path: Path) -> list[str]:
    body = path.read_text()
    return re.findall(r"\bop\.(\w+)\(", body)


def _tables(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _use_with_our_tools(db: Path) -> None:
    """SessionDB, the CLI and adoption treat the file as ours, at head."""
    assert migrations.current(db) == migrations.head()
    assert not adopt.needs_adoption(db)
    before = _tables(db)
    with SessionDB(db) as sdb:
        sdb.create_session("s1", "cli")
        sdb.append_message("s1", "user", "kubernetes rollout from the host app")
        assert [h["session_id"] for h in sdb.search_messages("kubernetes")] == ["s1"]
    assert _tables(db) == before  # nothing was re-run or added
    script = Path(sys.executable).parent / "hermes-store"
    cli = subprocess.run([str(script), "--db", str(db), "--json", "current"], capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    assert migrations.head() in cli.stdout


def test_ours_first(tmp_path: Path) -> None:
    host = make_host(tmp_path, "ours-first")
    db = host / "app.db"
    _alembic(host, "revision", "--autogenerate", "-m", "host tables")
    [rev] = _new_revisions(host)
    assert _ops(rev) == ["create_table", "drop_table"], rev.read_text()  # only the host's table
    assert "host_bookmarks" in rev.read_text()
    _alembic(host, "upgrade", "head")
    assert {"host_bookmarks", "sessions", "messages", "messages_fts", "hermes_store_version",
            "alembic_version"} <= _tables(db)
    check = _alembic(host, "check")
    assert "No new upgrade operations detected" in check.stdout + check.stderr
    _alembic(host, "revision", "--autogenerate", "-m", "nothing")
    empty = [p for p in _new_revisions(host) if p != rev]
    assert len(empty) == 1 and _ops(empty[0]) == []
    with sqlite3.connect(db) as conn:
        assert [r[0] for r in conn.execute("SELECT version_num FROM hermes_store_version")] == [migrations.head()]
        host_versions = [r[0] for r in conn.execute("SELECT version_num FROM alembic_version")]
    assert host_versions and migrations.head() not in host_versions
    _use_with_our_tools(db)


def test_branch(tmp_path: Path) -> None:
    ours_before = sorted(p.name for p in migrations.versions_location().iterdir())
    host = make_host(tmp_path, "branch")
    db = host / "app.db"
    commands = [shlex.split(line) for line in readme_block("branch/commands").splitlines() if line.strip()]
    assert [c[:2] for c in commands] == [["alembic", "upgrade"], ["alembic", "revision"],
                                         ["alembic", "upgrade"], ["alembic", "check"]]
    for argv in commands:
        _alembic(host, *argv[1:])
    revs = _new_revisions(host)
    assert len(revs) == 1, revs  # created in the host's folder, never inside our package
    assert sorted(p.name for p in migrations.versions_location().iterdir()) == ours_before
    assert _ops(revs[0]) == ["create_table", "drop_table"], revs[0].read_text()
    assert "host_bookmarks" in revs[0].read_text() and "messages_fts" not in revs[0].read_text()
    with sqlite3.connect(db) as conn:
        versions = {r[0] for r in conn.execute("SELECT version_num FROM alembic_version")}
    assert migrations.head() in versions and len(versions) == 2
    assert "hermes_store_version" not in _tables(db)
    # Autogenerate on unchanged models is empty.
    _alembic(host, "revision", "--autogenerate", "-m", "nothing", "--head", "host@head")
    later = [p for p in _new_revisions(host) if p not in revs]
    assert len(later) == 1 and _ops(later[0]) == []
    # The cross-MetaData foreign key is real: it cascades from our sessions.
    _use_with_our_tools(db)
    engine = sa_create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        conn.exec_driver_sql("PRAGMA foreign_keys=ON")
        conn.execute(text("INSERT INTO host_bookmarks(session_id, label) VALUES ('s1', 'first')"))
    with SessionDB(db) as sdb:
        assert sdb.delete_session("s1") is True
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM host_bookmarks")).scalar() == 0
    engine.dispose()


@pytest.mark.parametrize("outcome", ["commit", "rollback", "rollback-before-any-write"])
def test_upgrade_on_a_host_connection_joins_its_transaction(tmp_path: Path, outcome: str) -> None:
    """README's snippet: commit keeps both, rollback keeps neither, and we send no
    COMMIT/ROLLBACK of our own on the host's connection."""
    from sqlalchemy import event

    db = tmp_path / "host.db"
    engine = sa_create_engine(f"sqlite:///{db}")  # a plain engine: none of our hooks
    sent: list[str] = []
    with engine.connect() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS audit (what TEXT)"))
        conn.commit()
        event.listen(conn, "before_cursor_execute", lambda *a: sent.append(a[2]))
        if outcome == "rollback-before-any-write":
            conn.begin()  # pysqlite has sent no BEGIN yet: only a SELECT so far
            conn.execute(text("SELECT count(*) FROM audit"))
        else:
            conn.execute(text("INSERT INTO audit VALUES ('hermes_store installed')"))
        migrations.upgrade(conn)
        assert conn.in_transaction()
        conn.commit() if outcome == "commit" else conn.rollback()
    engine.dispose()
    tables = _tables(db)
    with sqlite3.connect(db) as raw:
        rows = raw.execute("SELECT what FROM audit").fetchall()
    if outcome == "commit":
        assert {"sessions", "messages", "messages_fts", "hermes_store_version"} <= tables
        assert rows == [("hermes_store installed",)]
        assert migrations.current(db) == migrations.head()
    else:
        assert tables == {"audit"}
        assert rows == []
        assert migrations.current(db) is None
    assert not any(s.strip().upper() in ("ROLLBACK", "COMMIT", "BEGIN") for s in sent)


def test_a_branch_mode_file_behind_head_is_left_to_the_host(tmp_path: Path) -> None:
    """Our tools never run our revisions on a file whose host Alembic records them."""
    db = tmp_path / "host.db"
    older = migrations.head() if len(REVISIONS) < 2 else REVISIONS[-2]
    migrations.upgrade(db, older, version_table="alembic_version")  # what a host's Alembic leaves
    before = db.read_bytes()
    assert migrations.current(db) == older
    assert not adopt.needs_adoption(db)
    with pytest.raises(errors.ManagedByHostError, match="alembic upgrade heads"):
        migrations.upgrade(db)
    with pytest.raises(errors.ManagedByHostError):
        SessionDB(db)
    assert db.read_bytes() == before
