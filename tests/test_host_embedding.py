"""A host application embeds hermes_store, exactly as README's worked examples say.

Each test builds a real host project in a temp dir (own DeclarativeBase, ``alembic
init``, its own revisions) from the code blocks of README.md, and drives the real
``alembic`` command line (``python -m alembic`` in a subprocess), on SQLite and on
PostgreSQL. So the README cannot go stale without a test failing.

Both ways ("ours first", "our revisions as a branch of yours") must give: a first
autogenerate holding only the host's table, a working ``upgrade``, a second autogenerate
that is empty and a passing ``alembic check``, no warning about our indexes, and a store
that ``SessionDB`` and ``hermes-store`` use, with the host's ``ON DELETE CASCADE`` key to
our sessions really cascading. A revision of ours that rebuilds ``messages`` (batch mode
on SQLite) runs through the host's env.py too.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from alembic.util import format_as_comma
from mako.template import Template
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy import inspect, text
from sqlalchemy.engine import make_url

import hermes_store
import hermes_store.models
from hermes_store import SessionDB, adopt, errors, introspect, migrations
from hermes_store.paths import script_location

REPO = Path(__file__).resolve().parent.parent
#: Our revision ids, oldest first.
REVISIONS = [s.revision for s in reversed(list(ScriptDirectory.from_config(migrations.make_config()).walk_revisions()))]
#: The host projects talk to the server the way README's env.py does: straight, with a
#: plain engine (a transaction pooler in front is the host's own setup, not ours).
pytestmark = [pytest.mark.slow, pytest.mark.both_backends, pytest.mark.pg_direct]


def readme_block(name: str) -> str:
    """The fenced block that follows ``<!-- host-example: NAME -->`` in README.md."""
    readme = (REPO / "README.md").read_text()
    m = re.search(rf"<!-- host-example: {re.escape(name)} -->\s*```\w*\n(.*?)```", readme, re.S)
    assert m, f"README.md has no host-example block {name!r}"
    return m.group(1)


@pytest.fixture
def database(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """The host's database: a file that does not exist yet, or a new empty server database."""
    if backend == "postgresql":
        return request.getfixturevalue("pg_database")
    return f"sqlite:///{tmp_path / 'host' / 'app.db'}"  # in the host project, as its ini says


class Host:
    """A host project on disk, and everything its ``alembic`` runs printed."""

    def __init__(self, root: Path, url: str) -> None:
        self.root, self.url = root, url
        self.output: list[str] = []

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ)
        # The host's modules, and the same hermes_store this test process imported.
        env["PYTHONPATH"] = os.pathsep.join([str(self.root), str(Path(hermes_store.__file__).resolve().parent.parent)])
        env["HERMES_HOME"] = str(self.root / "hermes-home")
        env.pop("HERMES_STORE_URL", None)
        env.pop("PYTHONWARNINGS", None)  # Python's default filters: a host sees what we warn
        out = subprocess.run(list(argv), cwd=self.root, env=env, capture_output=True, text=True)
        self.output.append(out.stdout + out.stderr)
        return out

    def alembic(self, *args: str) -> subprocess.CompletedProcess[str]:
        out = self.run(sys.executable, "-m", "alembic", *args)
        assert out.returncode == 0, f"alembic {' '.join(args)}\n{out.stdout}\n{out.stderr}"
        return out

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        out = self.run(str(Path(sys.executable).parent / "hermes-store"), "--url", self.url, *args)
        assert out.returncode == 0, f"hermes-store {' '.join(args)}\n{out.stdout}\n{out.stderr}"
        return out

    def revisions(self) -> list[Path]:
        return sorted((self.root / "alembic" / "versions").glob("*.py"))

    def set_ini(self, **options: str) -> None:
        ini = configparser.ConfigParser(interpolation=None)
        ini.read(self.root / "alembic.ini")
        for key, value in options.items():
            ini["alembic"][key] = value
        with open(self.root / "alembic.ini", "w") as fh:
            ini.write(fh)

    def assert_quiet(self) -> None:
        """No run printed a warning about our indexes (README's env.py filters them)."""
        said = "\n".join(self.output)
        assert "expression-based index" not in said and "Warning" not in said, said[-3000:]


def make_host(tmp_path: Path, mode: str, url: str) -> Host:
    """A host project whose env.py is README's ``{mode}/env.py``; ``async`` mode is made by
    ``alembic init -t async`` and its ini names the database's async driver."""
    host = Host(tmp_path / "host", url)
    (host.root / "hostapp").mkdir(parents=True)
    (host.root / "hostapp" / "__init__.py").write_text("")
    (host.root / "hostapp" / "models.py").write_text(readme_block("hostapp/models.py"))
    host.alembic("init", *(["-t", "async"] if mode == "async" else []), "alembic")
    if url.startswith("sqlite"):
        url = "sqlite:///%(here)s/app.db"  # as a host writes it
    if mode == "async":
        url = url.replace("sqlite://", "sqlite+aiosqlite://").replace("postgresql+psycopg://", "postgresql+asyncpg://")
    options = {"sqlalchemy.url": url.replace("%", "%%") if "%(here)s" not in url else url}
    if mode == "branch":
        extra = configparser.ConfigParser(interpolation=None)
        extra.read_string(readme_block("branch/alembic.ini"))
        options.update(extra["alembic"])
    host.set_ini(**options)
    (host.root / "alembic" / "env.py").write_text(readme_block(f"{mode}/env.py"))
    return host


def _ops(path: Path) -> list[str]:
    return re.findall(r"\bop\.(\w+)\(", path.read_text())


def _tables(url: str) -> set[str]:
    engine = sa_create_engine(url)
    try:
        with engine.connect() as conn:
            return set(inspect(conn).get_table_names())
    finally:
        engine.dispose()


def _versions(url: str, table: str) -> set[str]:
    engine = sa_create_engine(url)
    try:
        with engine.connect() as conn:
            return {r[0] for r in conn.execute(text(f"SELECT version_num FROM {table}"))}
    finally:
        engine.dispose()


def _sqlite_file(url: str) -> Path | None:
    u = make_url(url)
    return Path(u.database) if u.get_backend_name() == "sqlite" else None


def _assert_only_the_host_table(rev: Path) -> None:
    assert _ops(rev) == ["create_table", "drop_table"], rev.read_text()
    body = rev.read_text()
    assert "host_bookmarks" in body and "alter_column" not in body and "messages_fts" not in body, body


def _assert_check_and_empty_autogenerate(host: Host, *head: str) -> None:
    check = host.alembic("check")
    assert "No new upgrade operations detected" in check.stdout + check.stderr
    before = set(host.revisions())
    host.alembic("revision", "--autogenerate", "-m", "nothing", *head)
    [later] = set(host.revisions()) - before
    assert _ops(later) == [], later.read_text()
    later.unlink()


def _use_with_our_tools(host: Host) -> None:
    """SessionDB and the command line take the store as ours, at head; the host's
    ON DELETE CASCADE key to our sessions cascades."""
    url = host.url
    assert migrations.current(url) == migrations.head()
    path = _sqlite_file(url)
    if path is not None:
        assert not adopt.needs_adoption(path)
    before = _tables(url)
    with SessionDB(url) as sdb:
        sdb.create_session("s1", "cli")
        sdb.create_session("s2", "cli")
        sdb.append_message("s1", "user", "kubernetes rollout from the host app")
        assert [h["session_id"] for h in sdb.search_messages("kubernetes")] == ["s1"]
    assert _tables(url) == before  # nothing was re-run or added
    listed = json.loads(host.cli("--json", "sessions").stdout)
    rows = listed["sessions"] if isinstance(listed, dict) else listed
    assert sorted(r["id"] for r in rows) == ["s1", "s2"], listed
    assert migrations.head() in host.cli("--json", "current").stdout

    engine = sa_create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO host_bookmarks(session_id, label) VALUES ('s1', 'first'), ('s2', 'second')"))
    with SessionDB(url) as sdb:
        assert sdb.delete_session("s1") is True
    with engine.connect() as conn:
        assert conn.execute(text("SELECT session_id FROM host_bookmarks")).scalars().all() == ["s2"]
    engine.dispose()


def test_ours_first(tmp_path: Path, database: str) -> None:
    host = make_host(tmp_path, "ours-first", database)
    host.alembic("revision", "--autogenerate", "-m", "host tables")
    [rev] = host.revisions()
    _assert_only_the_host_table(rev)
    up = host.alembic("upgrade", "head")
    # README's env.py reads the ini's logging: Alembic says what it runs, ours and the host's.
    assert re.search(r"Running upgrade\s+-> \w+, host tables", up.stderr), up.stderr
    assert f"-> {migrations.head()}," in up.stderr, up.stderr
    tables = _tables(database)
    assert {"host_bookmarks", "sessions", "messages", "hermes_store_version", "alembic_version"} <= tables
    if database.startswith("sqlite"):
        assert "messages_fts" in tables
    _assert_check_and_empty_autogenerate(host)
    assert _versions(database, "hermes_store_version") == {migrations.head()}
    assert _versions(database, "alembic_version") == {rev.name.split("_")[0]}
    _use_with_our_tools(host)
    host.assert_quiet()


def _ours(url: str) -> set[str]:
    """Our tables (and version table) in the database: what a read-only command must not make."""
    if (path := _sqlite_file(url)) is not None and not path.exists():
        return set()
    return _tables(url) & (set(hermes_store.models.metadata.tables) | {"hermes_store_version", "messages_fts"})


def _run_script(url: str, script: str) -> None:
    """Run an ``alembic … --sql`` script on the database, as a DBA would (sqlite3, psql)."""
    if (path := _sqlite_file(url)) is not None:
        with sqlite3.connect(path) as conn:
            conn.executescript(script)
        return
    import psycopg

    with psycopg.connect(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False),
                         autocommit=True) as conn:
        conn.execute(script)  # no parameters: one simple-protocol round trip, BEGIN … COMMIT included


def _reads_write_nothing_and_sql_builds_it_all(host: Host, database: str) -> None:
    """README's "ours first" env.py on an empty database: the commands that read, or that
    are about the host's revisions only, create nothing of ours; ``upgrade head --sql``
    connects to nothing and writes our DDL first, then the host's; that script, run on the
    empty database, gives a store at our head that our tools use."""
    host.alembic("current")
    assert _ours(database) == set()
    check = host.run(sys.executable, "-m", "alembic", "check")  # fails: the host's table is due
    assert "New upgrade operations detected" in check.stdout + check.stderr, check.stderr
    assert _ours(database) == set()
    host.alembic("revision", "--autogenerate", "-m", "host tables")
    [rev] = host.revisions()
    _assert_only_the_host_table(rev)
    assert _ours(database) == set()
    host.alembic("history")
    host.alembic("downgrade", f"{rev.name.split('_')[0]}:base", "--sql")
    assert _ours(database) == set()

    # Back to an empty database (Alembic's own `check` and autogenerate made an empty
    # alembic_version of the host's); offline, not even a SQLite file is made.
    if (path := _sqlite_file(database)) is not None:
        path.unlink(missing_ok=True)
    else:
        engine = sa_create_engine(database)
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE alembic_version"))
        engine.dispose()
    script = host.alembic("upgrade", "head", "--sql").stdout
    assert _ours(database) == set()
    if (path := _sqlite_file(database)) is not None:
        assert not path.exists()
    ours, theirs = script.find("CREATE TABLE sessions"), script.find("CREATE TABLE host_bookmarks")
    assert 0 <= ours < theirs, script[-2000:]
    assert "CREATE TABLE hermes_store_version" in script and "INSERT INTO alembic_version" in script

    # A range of the host's says where ours is, or is refused with one typed line.
    bad = host.run(sys.executable, "-m", "alembic", "upgrade", f"{rev.name.split('_')[0]}:head", "--sql")
    assert bad.returncode != 0 and "InvalidInputError" in bad.stderr and "hermes_store_from" in bad.stderr, bad.stderr
    none_of_ours = host.alembic("-x", "hermes_store_from=head", "upgrade", "base:head", "--sql").stdout
    assert "CREATE TABLE host_bookmarks" in none_of_ours and "CREATE TABLE sessions" not in none_of_ours

    _run_script(database, script)
    assert migrations.current(database) == migrations.head()
    assert _versions(database, "alembic_version") == {rev.name.split("_")[0]}
    _assert_check_and_empty_autogenerate(host)
    _use_with_our_tools(host)
    host.assert_quiet()


def test_ours_first_reads_write_nothing_and_sql_builds_it_all(tmp_path: Path, database: str) -> None:
    _reads_write_nothing_and_sql_builds_it_all(make_host(tmp_path, "ours-first", database), database)


def test_async_ours_first(tmp_path: Path, database: str) -> None:
    """README's async env.py in a project made by ``alembic init -t async``: autogenerate
    holds only the host's table (never a drop of ours), ``upgrade`` runs ours then the
    host's, a second autogenerate is empty and ``check`` passes, on aiosqlite and asyncpg."""
    host = make_host(tmp_path, "async", database)
    host.alembic("revision", "--autogenerate", "-m", "host tables")
    [rev] = host.revisions()
    _assert_only_the_host_table(rev)
    up = host.alembic("upgrade", "head")
    assert re.search(r"Running upgrade\s+-> \w+, host tables", up.stderr), up.stderr
    assert {"host_bookmarks", "sessions", "messages", "hermes_store_version", "alembic_version"} <= _tables(database)
    _assert_check_and_empty_autogenerate(host)
    assert _versions(database, "hermes_store_version") == {migrations.head()}
    assert _versions(database, "alembic_version") == {rev.name.split("_")[0]}
    _use_with_our_tools(host)
    host.assert_quiet()


def test_async_ours_first_reads_write_nothing_and_sql_builds_it_all(tmp_path: Path, database: str) -> None:
    _reads_write_nothing_and_sql_builds_it_all(make_host(tmp_path, "async", database), database)


def branch_host(tmp_path: Path, database: str) -> tuple[Host, Path]:
    """A host in branch mode after README's commands; its first revision."""
    ours_before = sorted(p.name for p in migrations.versions_location().iterdir())
    host = make_host(tmp_path, "branch", database)
    commands = [shlex.split(line) for line in readme_block("branch/commands").splitlines() if line.strip()]
    assert [c[:2] for c in commands] == [["alembic", "upgrade"], ["alembic", "revision"],
                                         ["alembic", "upgrade"], ["alembic", "check"]]
    for argv in commands:
        host.alembic(*argv[1:])
    [rev] = host.revisions()  # created in the host's folder, never inside our package
    assert sorted(p.name for p in migrations.versions_location().iterdir()) == ours_before
    return host, rev


def test_branch(tmp_path: Path, database: str) -> None:
    host, rev = branch_host(tmp_path, database)
    _assert_only_the_host_table(rev)
    # A branch of its own, depending on nothing of ours (README says why).
    assert re.search(r"^down_revision\b.*= None$", rev.read_text(), re.M)
    assert re.search(r"^depends_on\b.*= None$", rev.read_text(), re.M)
    host_rev = rev.name.split("_")[0]
    assert _versions(database, "alembic_version") == {migrations.head(), host_rev}
    assert "hermes_store_version" not in _tables(database)
    _assert_check_and_empty_autogenerate(host, "--head", "host@head")

    # From nothing, as on a new machine: both branches down, then `upgrade heads` at once
    # (on PostgreSQL it fails if the host's table comes before our sessions).
    host.alembic("downgrade", "base")
    assert _tables(database) == {"alembic_version"}
    assert _versions(database, "alembic_version") == set()
    host.alembic("upgrade", "heads")
    assert _versions(database, "alembic_version") == {migrations.head(), host_rev}
    _assert_check_and_empty_autogenerate(host, "--head", "host@head")

    # Offline, README's env.py connects to nothing and the script holds both branches.
    before = _tables(database)
    script = host.alembic("upgrade", "heads", "--sql").stdout
    assert 0 <= script.find("CREATE TABLE sessions") < script.find("CREATE TABLE host_bookmarks"), script[-2000:]
    assert _tables(database) == before
    if _sqlite_file(database) is not None:  # and it builds the same store from nothing
        fresh = f"sqlite:///{tmp_path / 'from-script.db'}"
        _run_script(fresh, script)
        assert _versions(fresh, "alembic_version") == {migrations.head(), host_rev}
        assert migrations.current(fresh) == migrations.head()
    _use_with_our_tools(host)
    host.assert_quiet()


#: A host project's own first revision, made before it took hermes_store in.
HOST_NOTES_MODEL = """

class Note(HostBase):
    __tablename__ = "host_notes"

    id: Mapped[int] = mapped_column(primary_key=True)
"""
HOST_NOTES_REVISION = """from alembic import op
import sqlalchemy as sa

revision = "host0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade():
    op.create_table("host_notes", sa.Column("id", sa.Integer(), nullable=False), sa.PrimaryKeyConstraint("id"))


def downgrade():
    op.drop_table("host_notes")
"""


def test_branch_on_a_host_with_revisions(tmp_path: Path, database: str) -> None:
    """Way 2 for a project that already has revisions: README's commands with ``--head
    <your head>`` instead of ``base`` keep two heads (the host's chain goes on), not three."""
    readme = (REPO / "README.md").read_text()
    assert "`--head <your head> --branch-label host`" in readme
    host = make_host(tmp_path, "branch", database)
    with open(host.root / "hostapp" / "models.py", "a") as fh:
        fh.write(HOST_NOTES_MODEL)
    (host.root / "alembic" / "versions").mkdir(exist_ok=True)
    (host.root / "alembic" / "versions" / "host0001_notes.py").write_text(HOST_NOTES_REVISION)
    locations = readme_block("branch/alembic.ini").split("version_locations =")[1].split("\n")[0].strip()
    host.set_ini(version_locations=locations.split()[0])  # before hermes_store: the host's folder only
    host.alembic("upgrade", "head")
    host.set_ini(version_locations=locations)

    heads = host.alembic("heads").stdout.splitlines()
    [theirs] = [line.split()[0] for line in heads if "(hermes_store)" not in line]
    assert theirs == "host0001"
    for line in readme_block("branch/commands").splitlines():
        argv = shlex.split(line.replace("--head base", "--head <your head>").replace("<your head>", theirs))
        host.alembic(*argv[1:])
    [rev] = [p for p in host.revisions() if not p.name.startswith("host0001")]
    assert re.search(r"^down_revision\b.*= ['\"]host0001['\"]$", rev.read_text(), re.M), rev.read_text()
    _assert_only_the_host_table(rev)
    assert len(host.alembic("heads").stdout.splitlines()) == 2  # the host's and ours, not a third
    host_rev = rev.name.split("_")[0]
    assert _versions(database, "alembic_version") == {migrations.head(), host_rev}
    assert {"host_notes", "host_bookmarks", "sessions"} <= _tables(database)
    _assert_check_and_empty_autogenerate(host, "--head", "host@head")
    _use_with_our_tools(host)
    host.assert_quiet()


#: What a contributor's revision of ours does to ``messages`` (autogenerate gives the
#: same operations), rendered from our own revision template like ``alembic revision``.
REBUILD_HELPER = '''

def _recreate() -> str:
    """A real table rebuild on SQLite, both ways; PostgreSQL alters in place."""
    return "always" if op.get_bind().dialect.name == "sqlite" else "auto"
'''
REBUILD_UPGRADE = """with op.batch_alter_table("messages", recreate=_recreate()) as batch_op:
        batch_op.add_column(sa.Column("hs9001_probe", sa.TEXT(), nullable=True))"""
REBUILD_DOWNGRADE = """with op.batch_alter_table("messages", recreate=_recreate()) as batch_op:
        batch_op.drop_column("hs9001_probe")"""


def render_our_revision(folder: Path, rev_id: str, down: str, upgrades: str = REBUILD_UPGRADE,
                        downgrades: str = REBUILD_DOWNGRADE) -> Path:
    """A revision file made from our script.py.mako, as ``alembic revision`` makes it."""
    folder.mkdir(parents=True, exist_ok=True)
    body = Template(filename=str(script_location() / "script.py.mako")).render_unicode(
        message="a contributor's column on messages", up_revision=rev_id, down_revision=down,
        create_date="2026-12-02", branch_labels=None, depends_on=None, imports=REBUILD_HELPER,
        upgrades=upgrades, downgrades=downgrades, comma=format_as_comma,
    )
    assert "keep_triggers_across_batch(op.get_bind())" in body  # the template installs the hooks
    path = folder / f"{rev_id}_probe_column.py"
    path.write_text(body)
    return path


def test_a_revision_from_our_template_renders_offline(tmp_path: Path, backend: str) -> None:
    """``upgrade --sql`` (ours, or a host's that writes ours first) through a contributor's
    revision made from our template: the template's batch hooks have no connection to hook
    offline and stay out of the way; the script holds the new column."""
    import io

    from alembic import command

    extra = tmp_path / "contributor-versions"
    render_our_revision(extra, "hs9001", migrations.head(),
                        upgrades='op.add_column("messages", sa.Column("hs9001_probe", sa.TEXT(), nullable=True))',
                        downgrades='op.drop_column("messages", "hs9001_probe")')
    url = "sqlite:///app.db" if backend == "sqlite" else "postgresql+psycopg://host.invalid/app"
    out = io.StringIO()
    cfg = migrations.make_config(url)
    cfg.set_main_option("path_separator", "space")
    cfg.set_main_option("version_locations", f"{migrations.versions_location()} {extra}")
    cfg.output_buffer = out
    command.upgrade(cfg, "head", sql=True)
    assert re.search(r"ALTER TABLE messages ADD COLUMN hs9001_probe", out.getvalue()), out.getvalue()[-2000:]
    assert not (tmp_path / "app.db").exists()


def _messages_machinery(url: str) -> dict:
    """Triggers, views, indexes and FTS tables of a SQLite store (empty on a server)."""
    path = _sqlite_file(url)
    if path is None:
        return {}
    with sqlite3.connect(path) as conn:
        snap = introspect.snapshot(conn)
    return {kind: snap[kind] for kind in ("triggers", "views", "indexes", "virtual")} | {
        "autoincrement": snap["tables"]["messages"]["autoincrement"]}


def _columns(url: str, table: str) -> list[str]:
    engine = sa_create_engine(url)
    try:
        with engine.connect() as conn:
            return [c["name"] for c in inspect(conn).get_columns(table)]
    finally:
        engine.dispose()


def test_branch_runs_our_rebuild_of_messages(tmp_path: Path, database: str) -> None:
    """A later revision of ours that rebuilds ``messages`` runs through the host's plain
    env.py (no hooks of ours there: the revision installs them), up and down."""
    host, _rev = branch_host(tmp_path, database)
    with SessionDB(database) as sdb:
        sdb.create_session("s1", "cli")
        for word in ("alpha", "beta", "gamma"):
            sdb.append_message("s1", "user", f"{word} pelican")
    machinery = _messages_machinery(database)
    rows_before = _message_rows(database)
    extra = tmp_path / "contributor-versions"
    render_our_revision(extra, "hs9001", migrations.head())
    locations = readme_block("branch/alembic.ini").split("version_locations =")[1].split("\n")[0].strip()
    host.set_ini(version_locations=f"{locations} {extra}")

    host.alembic("upgrade", "heads")
    assert "hs9001" in _versions(database, "alembic_version")
    assert "hs9001_probe" in _columns(database, "messages")
    assert _messages_machinery(database) == machinery  # triggers, views, indexes, AUTOINCREMENT kept
    assert _message_rows(database) == rows_before
    _search_follows_writes(database, "heron")

    host.alembic("downgrade", "hermes_store@-1")
    assert "hs9001_probe" not in _columns(database, "messages")
    assert _messages_machinery(database) == machinery
    assert migrations.head() in _versions(database, "alembic_version")
    _search_follows_writes(database, "osprey")
    host.assert_quiet()


def _message_rows(url: str) -> list[tuple]:
    engine = sa_create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text("SELECT id, session_id, content FROM messages ORDER BY id"))]
    finally:
        engine.dispose()


def _search_follows_writes(url: str, word: str) -> None:
    """A row written after the rebuild is found by the search index (its triggers live)."""
    engine = sa_create_engine(url)
    try:
        with engine.begin() as conn:
            new_id = conn.execute(text(
                "INSERT INTO messages (session_id, role, content, timestamp) "
                "VALUES ('s1', 'user', :c, 1) RETURNING id"), {"c": f"{word} nest"}).scalar_one()
            if url.startswith("sqlite"):
                hits = conn.execute(text("SELECT rowid FROM messages_fts WHERE messages_fts MATCH :w"), {"w": word})
            else:
                hits = conn.execute(text("SELECT id FROM messages WHERE search_vector @@ plainto_tsquery(:w)"),
                                    {"w": word})
            assert hits.scalars().all() == [new_id]
            # Every earlier row is still found too (the rebuild kept the ids the index points at).
            if url.startswith("sqlite"):
                old = conn.execute(text("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'pelican'"))
                assert old.scalar() == 3
    finally:
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
    tables = _tables(f"sqlite:///{db}")
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
