"""README.md says what it can prove: the tests it names exist, and its snippets run.

Every ```python block either runs here, as written, in a fresh temp directory (its own
``python`` process, so ``SessionDB()``, relative paths and imports see nothing of this
test run), or is listed in ``COVERED_ELSEWHERE`` with the test that runs it; a new block
that is neither fails ``test_every_python_block_is_run_or_covered``. The same holds for
every ```bash block (``BASH_BLOCKS``, ``test_every_bash_block_is_run_or_covered``): the
first command and ``pip install ".[async]"`` run in fresh virtualenvs on a copy of this
checkout, the quick-start commands on a demo store (the hits and session the README's
comments promise are checked), the ``alembic -x url=`` line and the ``copy`` lines
against the test server. No example pins our head revision id: a contributor's new
revision must not make README wrong (CONTRIBUTING.md, "README and a new revision").
"""

from __future__ import annotations

import builtins
import json
import os
import re
import shlex
import subprocess
import symtable
import sqlite3
import sys
import uuid
from contextlib import closing
from pathlib import Path

import pytest

from hermes_store import migrations
from hermes_store.dialects import pg_citus
from hermes_store.engine import create_engine

from .helpers import required_module

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
BIN = Path(sys.executable).parent  # hermes-store lives next to this Python

#: A fenced block, with the ``<!-- host-example: NAME -->`` marker that may precede it.
FENCE = re.compile(r"(?:<!-- host-example: (?P<name>[^ ]+) -->\s*)?^```(?P<lang>\w*)\n(?P<body>.*?)^```", re.M | re.S)

#: In the blocks run here, these PostgreSQL URLs (the README's placeholders) are replaced by
#: the URL of a fresh database on the test server (the ``pg_database`` fixture).
PG_PLACEHOLDERS = ("postgresql+psycopg://user:pw@host/db",)

#: Blocks run by another test, by label: a host-example name, else the block's first line.
#: ``complete`` blocks are whole files (every name they use is defined or imported in
#: them); the others are fragments of a host's file.
COVERED_ELSEWHERE: dict[str, tuple[str, bool]] = {
    # Saved as app.py and served through FastAPI's test client (httpx), on SQLite and asyncpg.
    "fastapi/app.py": ("test_recipes_fastapi.py::test_the_readme_fastapi_app_runs", True),
    # Pasted over the env.py of `alembic init -t async`, driven by the real alembic command.
    "async/env.py": ("test_host_embedding.py::test_async_ours_first", True),
    "ours-first/env.py": ("test_host_embedding.py::test_ours_first", True),
    "branch/env.py": ("test_host_embedding.py::test_branch", True),
    "branch/alembic.ini": ("test_host_embedding.py::test_branch", False),
    "hostapp/models.py": ("test_host_embedding.py::test_ours_first", True),
    # Hermes v30's two swap files, saved as such beside a v30-style caller in a fresh interpreter.
    "hermes-v30/hermes_state.py": ("compat/test_v30_provider.py::test_hermes_v30_code_runs_on_the_file_through_its_own_switch", True),
    "hermes-v30/hermes_state_provider.py": (
        "compat/test_v30_provider.py::test_hermes_v30_code_runs_on_the_file_through_its_own_switch", True),
}

#: Blocks that are a module of their own: written to that file name and imported.
RUN_AS_MODULE = {"import sys, hermes_store.hermes_state as m; sys.modules[__name__] = m": "hermes_state.py"}

#: What each block run here claims, checked after it in the same process (keyed by a line
#: of the block). Every run block has an entry, so none runs unchecked.
CHECKS = {
    'db = SessionDB()                      # $HERMES_HOME/state.db': """
assert [h["session_id"] for h in hits] == ["s1"] and ">>>chat-send<<<" in hits[0]["snippet"], hits
assert [m["role"] for m in replay] == ["user", "assistant"], replay
import os; assert oct(os.stat(os.environ["HERMES_HOME"] + "/state.db").st_mode & 0o777) == "0o600"
""",
    'with UnitOfWork(engine) as uow:': """
assert tip == "s2", tip
assert [h["session_id"] for h in hits] == ["s2"], hits
with UnitOfWork(engine) as uow:
    assert uow.messages.count("s2") == 1  # committed
""",
    'migrations.upgrade("sqlite:///app.db")': """
assert migrations.current("app.db") == migrations.head()  # what the comment says
""",
    'db = SessionDB("postgresql+psycopg://': """
assert [h["session_id"] for h in db.search_messages("迁移")] == ["s1"]
""",
    'team_a = SessionDB(url, schema="team_a")': """
assert team_a.session_count() == 1 and team_b.session_count() == 0
""",
    "migrations.upgrade(conn)          # joins the transaction": """
import sqlite3
with sqlite3.connect("app.db") as raw:
    assert raw.execute("SELECT what FROM audit").fetchall() == [("hermes_store installed",)]
assert migrations.current("app.db") == migrations.head()
""",
    "import sys, hermes_store.hermes_state as m": """
import hermes_state, hermes_store.hermes_state
assert hermes_state is hermes_store.hermes_state and hermes_state.SessionDB.__module__.startswith("hermes_store")
""",
}


def blocks(lang: str) -> list[tuple[str, str]]:
    """``(label, body)`` of each block in ``lang``, in README order."""
    found = []
    for m in FENCE.finditer(README):
        if m.group("lang") == lang:
            found.append((m.group("name") or m.group("body").split("\n", 1)[0], m.group("body")))
    return found


PYTHON = blocks("python")
TO_RUN = [(label, body) for label, body in PYTHON if label not in COVERED_ELSEWHERE]


def test_every_test_named_in_the_readme_exists() -> None:
    named: list[tuple[str, str]] = []
    for m in re.finditer(r"`((?:\w+/)?test_\w+\.py)::test_\w+`(?:, `::test_\w+`)*", README):
        named += [(m.group(1), n) for n in re.findall(r"::(test_\w+)", m.group(0))]
    assert len(named) >= 15
    missing = [f"{f}::{n}" for f, n in named if not re.search(rf"^def {n}\(", (REPO / "tests" / f).read_text(), re.M)]
    assert missing == []


def _undefined_names(code: str) -> set[str]:
    """Names a module uses without defining or importing them (builtins aside)."""
    top = symtable.symtable(code, "<README>", "exec")
    defined = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()}
    used: set[str] = set()

    def walk(table: symtable.SymbolTable) -> None:
        for s in table.get_symbols():
            if s.is_referenced() and (table is top or s.is_global()):
                used.add(s.get_name())
        for child in table.get_children():
            walk(child)

    walk(top)
    return used - defined - set(dir(builtins))


def test_every_python_block_is_run_or_covered() -> None:
    labels = [label for label, _ in blocks("python") + blocks("ini")]
    assert len(PYTHON) >= 12
    for label in COVERED_ELSEWHERE:  # a listed block that is gone: the table is stale
        assert label in labels, f"COVERED_ELSEWHERE names a block README.md no longer has: {label!r}"
    for test, _ in COVERED_ELSEWHERE.values():
        file, name = test.split("::")
        assert re.search(rf"^def {name}\(", (REPO / "tests" / file).read_text(), re.M), test
    for label, body in TO_RUN:  # every block run here says what it proves
        assert sum(key in body for key in CHECKS) == 1, f"no (or more than one) CHECKS entry for the block {label!r}"
    for label, body in PYTHON:
        compile(body, label, "exec")
        if COVERED_ELSEWHERE.get(label, ("", True))[1]:  # a whole file or a block run as written
            assert _undefined_names(body) == set(), f"{label!r} uses names it does not define"


def _env(home: Path) -> dict[str, str]:
    # A user's shell: no pytest markers (Hermes' live-system guard reads them) and no URL.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_STORE_URL", "PYTEST_"))}
    env.update(HERMES_HOME=str(home), HOME=str(home), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH="", COLUMNS="120", NO_COLOR="1")
    return env


@pytest.mark.parametrize("label, body", TO_RUN, ids=[f"{i}:{label[:40]}" for i, (label, _) in enumerate(TO_RUN)])
def test_python_block_runs_as_written(label: str, body: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    check = next(code for key, code in CHECKS.items() if key in body)
    if "postgresql" in body:
        url = request.getfixturevalue("pg_database")
        for placeholder in PG_PLACEHOLDERS:
            body = body.replace(placeholder, url)
        assert "postgresql+psycopg://user" not in body, "a PostgreSQL URL in this block is not in PG_PLACEHOLDERS"
    home = tmp_path / "home"
    home.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    if label in RUN_AS_MODULE:
        (run / RUN_AS_MODULE[label]).write_text(body)
        script = f"import sys; sys.path.insert(0, '.')\n{check}"
    else:
        script = f"{body}\n{check}"
    done = subprocess.run([sys.executable, "-c", script], cwd=run, env=_env(home), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{label!r} failed:\n{done.stderr}"


# ----------------------------------------------------------------------------- commands


def _shell(line: str, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=_env(home), capture_output=True, text=True, timeout=120)


def _quick_start() -> list[str]:
    """The commands of the bash block under "Quick start for a Hermes user", comments cut,
    plus the one a comment names (``CJK works too: hermes-store search …``)."""
    section = README.split("## Quick start for a Hermes user", 1)[1]
    body = FENCE.search(section).group("body")
    commands = []
    for line in body.splitlines():
        command, _, comment = line.partition(" #")
        commands.append(command.strip())
        commands += re.findall(r"(hermes-store [^;,]+?)\s*$", comment)
    return [c for c in commands if c]


def test_quick_start_commands_on_a_demo_store(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    assert _shell("hermes-store --db $HERMES_HOME/state.db demo", tmp_path, home).returncode == 0
    commands = _quick_start()
    assert [c.split()[1] for c in commands] == ["adopt", "sessions", "search", "search", "show", "stats", "export"]
    out: dict[str, str] = {}
    for command in commands:
        done = _shell(command, tmp_path, home)
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
        out[command] = done.stdout

    def one_hit(query: str, suffix: str) -> None:
        [command] = [c for c in commands if shlex.split(c)[1:] == ["search", query]]
        assert "1 result(s)" in out[command] and f"_{suffix} ·" in out[command], out[command]
        doc = json.loads(_shell(f"hermes-store --json search {shlex.quote(query)}", tmp_path, home).stdout)
        assert [h["session_id"].rsplit("_", 1)[1] for h in doc["results"]] == [suffix]

    assert "nothing to adopt" in out[commands[0]]
    one_hit("deploy chat-send", "d90a44")  # the demo's open question
    one_hit("数据库迁移", "c3e5f1")  # the Telegram session, in Chinese
    [show] = [c for c in commands if c.split()[1] == "show"]
    assert re.search(r"^Session\s+20261130_\d{6}_d90a44\b", out[show], re.M) and "chat-send" in out[show]
    assert "title_generation" in out[next(c for c in commands if c.startswith("hermes-store stats"))]
    backup = tmp_path / "backup.jsonl"
    assert len(backup.read_text().splitlines()) == 6
    # "`import` reads it back, idempotently": on the store it came from, nothing changes.
    again = json.loads(_shell(f"hermes-store --json import {backup}", tmp_path, home).stdout)
    sessions = json.loads(_shell("hermes-store --json sessions --all", tmp_path, home).stdout)["sessions"]
    assert len(sessions) == 6, again


def test_the_first_commands_tail_finds_kubernetes(tmp_path: Path) -> None:
    """README's first command, from its first ``hermes-store`` on (the install is this venv)."""
    first = FENCE.search(README).group("body").strip()
    parts = [p.strip() for p in first.split("&&")]
    tail = " && ".join(parts[next(i for i, p in enumerate(parts) if p.startswith("hermes-store")):])
    assert tail == "hermes-store --db demo.db demo && hermes-store --db demo.db search kubernetes"
    done = _shell(tail, tmp_path, tmp_path)
    assert done.returncode == 0, done.stderr
    assert ">>>Kubernetes<<<" in done.stdout and "1 result(s)" in done.stdout, done.stdout


# --------------------------------------------------------------------------- bash blocks

#: Every ```bash block of README.md, by its first line: run by a test here, or by the test
#: (or the CI step) named. A new block that is neither fails the first test below.
BASH_BLOCKS: dict[str, str] = {
    "python3 -m venv .venv": "test_the_first_command_in_a_fresh_venv",
    'pip install ".[test]" && pytest -q -n 2': ".ci/run (it calls exactly this command)",
    'pip install ".[async]"': "test_the_async_install_in_a_fresh_venv",
    "hermes-store adopt": "test_quick_start_commands_on_a_demo_store",
    'pip install ".[postgresql]"': "test_postgresql_block_migrates_a_server_database",
    "hermes-store copy --from ~/.hermes/state.db": "test_copy_block_moves_the_demo_there_and_back",
    'eval "$(scripts/pg-test-server start)"': "test_the_test_server_block_starts_and_stops_a_server",
    'eval "$(scripts/citus-test-cluster start)"': "test_the_citus_cluster_block_starts_and_stops_a_cluster",
    'hermes-store --url "$COORDINATOR_URL" tenants list': "test_the_tenants_block_lists_distributes_and_moves",
    "hermes-store --db state.db encrypt": "test_the_encryption_block_encrypts_rekeys_and_decrypts",
    "hermes-store retention set": "test_the_retention_block_sets_shows_and_applies",
    "branch/commands": "test_host_embedding.py::test_branch",
}


def bash_block(first: str) -> list[str]:
    """The command lines of the bash block whose first line starts with ``first``, comments cut."""
    [body] = [body for label, body in blocks("bash") if label.startswith(first)]
    return [line.partition(" #")[0].strip() for line in body.splitlines() if line.strip()]


def test_every_bash_block_is_run_or_covered() -> None:
    labels = [label for label, _ in blocks("bash")]
    assert len(labels) == len(BASH_BLOCKS), labels
    for label in labels:
        assert sum(label.startswith(key) for key in BASH_BLOCKS) == 1, f"README bash block {label!r} is run by no test"
    for where in BASH_BLOCKS.values():
        name = where.split(" ", 1)[0]
        file, _, test = name.rpartition("::")
        if test.startswith("test_"):
            assert re.search(rf"^def {test}\(", (REPO / "tests" / (file or "test_readme.py")).read_text(), re.M), where
    ci = (REPO / ".ci" / "run").read_text()
    assert 'pip install ".[test]" && pytest -q -n 2' in README and "README.md" in ci


def test_postgresql_block_migrates_a_server_database(pg_database: str, tmp_path: Path) -> None:
    """The install line names an extra this checkout has (psycopg is in it, and installed
    here), and the ``alembic -x url=…`` line, run from a checkout, creates the store."""
    install, migrate = bash_block('pip install ".[postgresql]"')
    pyproject = (REPO / "pyproject.toml").read_text()
    assert install == 'pip install ".[postgresql]"' and re.search(r'^postgresql = \["psycopg', pyproject, re.M)
    line = migrate.replace("postgresql+psycopg://user:pw@host/db", pg_database)
    assert line != migrate and line.startswith("alembic -x url=")
    home = tmp_path / "home"
    home.mkdir()
    done = subprocess.run(["bash", "-c", line], cwd=REPO, env=_env(home), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    from_python = subprocess.run([sys.executable, "-c", f"from hermes_store import migrations; print(migrations.current({pg_database!r}), migrations.head())"],
                                 env=_env(home), capture_output=True, text=True, timeout=120)
    revision, head = from_python.stdout.split()
    assert revision == head, from_python.stderr


def test_copy_block_moves_the_demo_there_and_back(pg_database: str, tmp_path: Path) -> None:
    """``copy`` to a server and back to ``~/back/state.db``: the same 6 demo sessions."""
    home = tmp_path / "home"
    (home / ".hermes").mkdir(parents=True)
    assert _shell("hermes-store --db ~/.hermes/state.db demo", tmp_path, home).returncode == 0
    lines = bash_block("hermes-store copy --from ~/.hermes/state.db")
    assert len(lines) == 2
    for line in lines:
        done = _shell(line.replace("postgresql+psycopg://user@host/hermes", pg_database), tmp_path, home)
        assert done.returncode == 0, f"{line}: {done.stderr}"
    listed = {where: json.loads(_shell(f"hermes-store {where} --json sessions --all", tmp_path, home).stdout)["sessions"]
              for where in ("--db ~/.hermes/state.db", f"--url {pg_database}", "--db ~/back/state.db")}
    ids = [sorted(s["id"] for s in found) for found in listed.values()]
    assert len(ids[0]) == 6 and ids[0] == ids[1] == ids[2], ids


def test_the_test_server_block_starts_and_stops_a_server(tmp_path: Path) -> None:
    """The block's first and last lines, as written, around a check that both exported
    URLs connect (its middle line is the README's test command, which CI runs)."""
    start, middle, stop = bash_block('eval "$(scripts/pg-test-server start)"')
    assert middle == 'pytest -q -n 2'
    probe = ("python -c 'import os, psycopg\n"
             "for k in (\"HERMES_STORE_TEST_PG_URL\", \"HERMES_STORE_TEST_PGBOUNCER_URL\"):\n"
             "    url = os.environ[k].replace(\"+psycopg\", \"\")\n"
             "    print(k, psycopg.connect(url, autocommit=True).execute(\"SELECT 1\").fetchone()[0])'")
    script = f'set -e\n{start}\ntrap \'{stop}\' EXIT\n{probe}\necho "dir=$PG_TEST_DIR"\n'
    done = subprocess.run(["bash", "-c", script], cwd=REPO, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "HERMES_STORE_TEST_PG_URL 1" in done.stdout and "HERMES_STORE_TEST_PGBOUNCER_URL 1" in done.stdout, done.stdout
    folder = Path(re.search(r"^dir=(\S+)$", done.stdout, re.M).group(1))
    assert not folder.exists()  # the stop line removed the server and its folder


def test_the_citus_cluster_block_starts_and_stops_a_cluster(citus_url: str, tmp_path: Path) -> None:
    """The block's first and last lines, as written, around a check that the exported
    coordinator has its 2 workers (its middle line runs the Citus tests, which CI runs).
    Runs where a cluster could be built: beside the one .ci/run started (its cache)."""
    start, middle, stop = bash_block('eval "$(scripts/citus-test-cluster start)"')
    assert middle == "pytest -q tests/test_citus.py" and citus_url
    probe = ("python -c 'import os, psycopg\n"
             "url = os.environ[\"HERMES_STORE_TEST_CITUS_URL\"].replace(\"+psycopg\", \"\")\n"
             "print(\"nodes\", psycopg.connect(url).execute(\"SELECT count(*) FROM pg_dist_node\").fetchone()[0])'")
    script = f'set -e\n{start}\ntrap \'{stop}\' EXIT\n{probe}\necho "dir=$CITUS_TEST_DIR"\n'
    env = _env(tmp_path)
    env["HOME"] = os.environ.get("HOME", str(tmp_path))  # the build cache of this machine
    done = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "nodes 3" in done.stdout, done.stdout
    folder = Path(re.search(r"^dir=(\S+)$", done.stdout, re.M).group(1))
    assert not folder.exists()  # the stop line removed the cluster and its folder


def test_the_encryption_block_encrypts_rekeys_and_decrypts(tmp_path: Path) -> None:
    """The "Encrypted stores" block, line by line on a demo store, with its two key files
    made as a user would (0600): after ``encrypt`` the file has no SQLite header, the
    search finds the demo's session with the key, and after ``decrypt`` plain sqlite3
    reads it again."""
    required_module("sqlcipher3", "the encryption block")
    home = tmp_path / "home"
    (home / ".hermes").mkdir(parents=True)
    for name, key in (("key", "correct horse battery staple"), ("key2", "a second passphrase")):
        (home / ".hermes" / name).write_text(key)
        (home / ".hermes" / name).chmod(0o600)
    assert _shell("hermes-store --db state.db demo", tmp_path, home).returncode == 0
    lines = bash_block("hermes-store --db state.db encrypt")
    assert [line.split("state.db ", 1)[1].split()[0] for line in lines] == ["encrypt", "search", "rekey", "decrypt"]
    for n, line in enumerate(lines):
        done = _shell(line, tmp_path, home)
        assert done.returncode == 0, (line, done.stderr)
        header = (tmp_path / "state.db").read_bytes()[:16]
        assert (header == b"SQLite format 3\x00") is (n == len(lines) - 1), (line, header)
        if "search" in line:
            assert "1 result(s)" in done.stdout and "Kubernetes" in done.stdout, done.stdout
    with closing(sqlite3.connect(tmp_path / "state.db")) as conn:
        assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == 6


def test_the_retention_block_sets_shows_and_applies(tmp_path: Path) -> None:
    """The "Retention policies" block on the default store of a demo home: both policies
    are stored and shown, the dry run announces what the apply then does, and the
    archive folder receives the deleted sessions before they go."""
    home = tmp_path / "home"
    home.mkdir()
    assert _shell("hermes-store demo", tmp_path, home).returncode == 0
    (home / "hermes-archive").mkdir()
    with closing(sqlite3.connect(home / "state.db")) as conn, conn:
        conn.execute("UPDATE sessions SET ended_at = started_at, end_reason = coalesce(end_reason, 'done'),"
                     " started_at = started_at - 90 * 86400, ended_at = started_at - 89 * 86400,"
                     " pinned = 0, title_source = 'llm' WHERE source = 'telegram'")
        old = conn.execute("SELECT count(*) FROM sessions WHERE source = 'telegram'").fetchone()[0]
    assert old >= 1
    lines = bash_block("hermes-store retention set")
    assert [line.split()[2] for line in lines] == ["set", "set", "show", "apply", "apply"]
    for line in lines[:3]:
        done = _shell(line, tmp_path, home)
        assert done.returncode == 0, (line, done.stderr)
    shown = json.loads(_shell("hermes-store --json retention show", tmp_path, home).stdout)
    assert len(json.dumps(shown)) > 0 and "telegram" in json.dumps(shown)
    dry = _shell(lines[3] + " --json", tmp_path, home)
    assert dry.returncode == 0, dry.stderr
    done = _shell(lines[4] + " --json", tmp_path, home)
    assert done.returncode == 0, done.stderr
    with closing(sqlite3.connect(home / "state.db")) as conn:
        assert conn.execute("SELECT count(*) FROM sessions WHERE source = 'telegram'").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == 6 - old
    archived = [json.loads(line) for f in (home / "hermes-archive").iterdir() for line in f.read_text().splitlines()]
    assert len(archived) == old, (done.stdout, list((home / "hermes-archive").iterdir()))


def test_the_tenants_block_lists_distributes_and_moves(citus_url: str, tmp_path: Path) -> None:
    """The "Placing tenants" block, line by line on the test cluster: its tenant is a
    fresh schema made before sharding (so ``distribute`` has work), its worker the one
    the tenant is not on."""
    listing, distribute, move = bash_block('hermes-store --url "$COORDINATOR_URL" tenants list')
    tenant = f"readme_{uuid.uuid4().hex[:10]}"
    engine = create_engine(citus_url)
    env = _env(tmp_path) | {"COORDINATOR_URL": citus_url}

    def shell(line: str) -> str:
        done = subprocess.run(["bash", "-c", line.replace("team_a", tenant) + " --json"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (line, done.stderr)
        return done.stdout

    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{tenant}"')
        migrations.upgrade(citus_url, schema=tenant)
        listed = {t["schema"]: t for t in json.loads(shell(listing))["tenants"]}
        assert listed[tenant]["distributed"] is False
        assert json.loads(shell(distribute))["distributed"] is True
        with engine.connect() as conn:
            [home] = pg_citus.schema_nodes(conn, tenant)
            other = next(n for n in pg_citus.nodes(conn) if n != home)
        assert "worker-2:5432" in move
        moved = json.loads(shell(move.replace("worker-2:5432", other)))
        assert (moved["moved"], moved["nodes_after"], moved["identical"]) == (True, [other], True)
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{tenant}" CASCADE')
        engine.dispose()


# ------------------------------------------------------------- installs, on a fresh copy

#: Left out of the checkout copy the install tests build from: what a fresh clone lacks
#: (a virtualenv, build output) or a wheel never holds.
_NOT_COPIED_AT_TOP = {".venv", ".git", "build", "dist", "bench", "tests", ".ci", "scripts"}
_NOT_COPIED = {"__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache"}


def _checkout_copy(tmp_path: Path) -> Path:
    """This checkout's sources in a folder of their own: ``pip install .`` builds there, so
    its ``build/`` and egg-info never land in our tree."""
    import shutil

    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n in _NOT_COPIED}
        if Path(folder) == REPO:
            skip |= {n for n in names if n in _NOT_COPIED_AT_TOP or n.endswith((".egg-info", ".db", ".db-wal", ".db-shm"))}
        return skip

    src = tmp_path / "checkout"
    shutil.copytree(REPO, src, ignore=ignore)
    return src


def _in_shell(script: str, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """``script`` in bash, as a user's shell (see ``_env``); pip may take a while."""
    home.mkdir(exist_ok=True)
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=_env(home), capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_first_command_in_a_fresh_venv(tmp_path: Path) -> None:
    """README's first command, whole and as written, in a copy of the checkout: a new
    virtualenv, ``pip install .``, the demo and its search, all from that virtualenv."""
    first = FENCE.search(README).group("body").strip()
    assert first.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install . && hermes-store ")
    src = _checkout_copy(tmp_path)
    done = _in_shell(first, src, tmp_path / "home")
    assert done.returncode == 0, done.stderr[-3000:]
    assert ">>>Kubernetes<<<" in done.stdout and "1 result(s)" in done.stdout, done.stdout
    where = subprocess.run([str(src / ".venv" / "bin" / "python"), "-c", "import hermes_store; print(hermes_store.__file__)"],
                           cwd=tmp_path, env=_env(tmp_path / "home"), capture_output=True, text=True, timeout=120)
    assert where.stdout.startswith(str(src / ".venv")), where  # installed there, not this run's package


ASYNC_PROBE = """
import asyncio, hermes_store
from hermes_store import aio

async def main():
    async with aio.AsyncSessionDB("state.db") as db:
        await db.create_session("s1", "api")
        await db.append_message("s1", "user", "kubernetes rollout")
        print(len(await db.search_messages("kubernetes")), hermes_store.__file__)

asyncio.run(main())
"""


@pytest.mark.slow
def test_the_async_install_in_a_fresh_venv(tmp_path: Path) -> None:
    """``pip install ".[async]"`` as README writes it, in a fresh virtualenv on a copy of the
    checkout (the package is on no index): aio then works on SQLite with aiosqlite."""
    [line] = bash_block('pip install ".[async]"')
    assert line == 'pip install ".[async]"'
    src = _checkout_copy(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    home = tmp_path / "home"
    # The probe runs outside the checkout, where only the installed package can be imported.
    done = _in_shell(f". {shlex.quote(str(venv))}/bin/activate && {line} && cd {shlex.quote(str(home))} && "
                     f"python -c {shlex.quote(ASYNC_PROBE)}", src, home)
    assert done.returncode == 0, done.stderr[-3000:]
    count, where = done.stdout.split()[-2:]
    assert count == "1" and where.startswith(str(venv)), done.stdout


def test_install_lines_name_this_checkout_not_an_index() -> None:
    """hermes-store is on no package index: every install line installs this checkout."""
    assert re.findall(r"pip install\s+\S*hermes-store", README) == []
    installs = re.findall(r"pip install ([^\s`]+)", README)
    assert installs and all(i == "." or i.startswith('".[') for i in installs), installs


# ------------------------------------------------------------------ the head revision id


def test_no_example_pins_the_head() -> None:
    """A contributor's new revision must not make README wrong: no block and no check names
    a revision id of ours, and prose names one only for what that revision did."""
    from hermes_store import migrations

    head = migrations.head()
    ours = re.compile(r"\bhs\d{4}\b")
    pinned = [label for label, body in blocks("python") + blocks("bash") + blocks("ini") if ours.search(body)]
    pinned += [f"CHECKS[{key!r}]" for key, check in CHECKS.items() if ours.search(check)]
    pinned += [line for line in README.splitlines() if head in line and re.search(r"newest|latest|\bhead\b", line)]
    assert pinned == [], (
        f"README.md pins the head revision ({head} today) in {pinned}: write migrations.head() (or "
        "`hermes-store current`) instead; CONTRIBUTING.md, 'README and a new revision', lists what to update"
    )
    guide = (REPO / "CONTRIBUTING.md").read_text()
    assert "README and a new revision" in guide and "test_no_example_pins_the_head" in guide


# ----------------------------------------------------------------- the facade's reads


def test_the_facade_reads_table_names_the_calls_the_facade_makes() -> None:
    """Each row of README's table is what that SessionDB method calls, on a repository a
    unit of work (sync and aio) has, with argument names both really take."""
    import inspect
    import typing

    from hermes_store import SessionDB, UnitOfWork, aio

    table = README.split("<!-- facade-reads -->", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `(\w+)\((.*?)\)` \| `(\w+)\.(\w+)\((.*?)\)` \|$", table, re.M)
    assert len(rows) >= 10, table
    repositories = typing.get_type_hints(UnitOfWork)
    for facade, facade_args, attr, method, repo_args in rows:
        repo = repositories[attr]
        assert attr in typing.get_type_hints(aio.AsyncUnitOfWork), attr
        source = inspect.getsource(getattr(SessionDB, facade))
        assert re.search(rf"{repo.__name__}\(c\)\s*\.{method}\(", source), f"SessionDB.{facade} does not call {attr}.{method}"
        for fn, args in ((getattr(SessionDB, facade), facade_args), (getattr(repo, method), repo_args)):
            names = set(inspect.signature(fn).parameters)
            assert set(re.findall(r"(\w+)=", args)) <= names, (fn, args)
