"""Hermes v30's provider contract (``hermes_state_provider``), through the swapped modules.

Our ``SessionDB`` is a ``SessionDBProvider`` on both backends; its write hooks veto
(pre-commit, inside the write transaction) and observe (post-write, after the commit
only); ``get_session_db_provider`` opens the file for ``sqlite`` and a server for
``postgresql`` from config.yaml's ``sessiondb`` section.
"""

from __future__ import annotations

import ast
import inspect
import json
import logging
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

import hermes_store
from hermes_store import errors
from hermes_store.state_modules import provider as provider_module

pytestmark = pytest.mark.both_backends


@pytest.fixture
def hsp(hermes_state):
    """``hermes_state_provider`` after the swap (served beside ``hermes_state``)."""
    import hermes_state_provider

    return hermes_state_provider


class Veto(Exception):
    """What a vetoing hook raises."""


def _in_transaction(conn) -> bool:
    """Whether the driver connection a hook got is inside an open transaction."""
    if hasattr(conn, "in_transaction"):  # sqlite3
        return bool(conn.in_transaction)
    return conn.info.transaction_status.name == "INTRANS"  # psycopg


def _count(conn, sql: str) -> int:
    return int(conn.execute(sql).fetchone()[0])


# ---------------------------------------------------------------- names and identity


def test_the_module_is_served_under_hermes_name_and_ours(hermes_state, hsp) -> None:
    import hermes_store.hermes_state_provider as shim

    assert hsp is provider_module and shim is provider_module
    assert hsp.SQLiteSessionProvider is hermes_state.SessionDB
    assert {"SessionDBProvider", "SQLiteProviderMixin", "get_session_db_provider"} <= set(dir(hsp))
    with pytest.raises(AttributeError):
        _ = hsp.NoSuchName


def test_a_bare_import_does_not_import_the_facade(tmp_path: Path) -> None:
    """Hermes' child processes import it by its bare name from the package folder; it must
    not drag ``hermes_state`` in at import time (Hermes' facade imports it, not the reverse)."""
    folder = Path(hermes_store.__file__).parent
    code = (
        "import sys; import hermes_state_provider as p; "
        "assert 'hermes_store.facade' not in sys.modules, 'facade imported'; "
        "assert p.__name__ == 'hermes_store.state_modules.provider'; "
        "assert p.SQLiteSessionProvider.__name__ == 'SessionDB'; "
        "assert issubclass(p.SQLiteSessionProvider, p.SessionDBProvider); print('ok')"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")}
    out = subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_session_db_satisfies_the_contract(hermes_state, hsp, db, backend) -> None:
    assert isinstance(db, hsp.SessionDBProvider)
    assert issubclass(hermes_state.SessionDB, hsp.SQLiteProviderMixin)
    # Every abstract member is implemented (an ABC with one left would refuse to instantiate).
    assert hermes_state.SessionDB.__abstractmethods__ == frozenset()
    assert len(hsp.SessionDBProvider.__abstractmethods__) == 26
    assert db.name == backend
    assert db.is_available() is True
    assert db.initialize() is None and db.initialize(anything=1) is None
    db.create_session("p1", "cli")
    assert db.get_session("p1")["source"] == "cli"
    db.shutdown()
    assert db.is_available() is False
    db.shutdown()  # idempotent, as close()
    with pytest.raises(errors.StoreClosedError):
        db.get_session("p1")


# ---------------------------------------------------------------- pre-commit hooks


def test_a_pre_commit_hook_sees_the_change_inside_the_transaction(db) -> None:
    db.create_session("s", "cli")
    seen: list[tuple[int, bool]] = []
    db.add_pre_commit_hook(lambda conn: seen.append(
        (_count(conn, "SELECT count(*) FROM messages WHERE session_id = 's'"), _in_transaction(conn))))
    db.append_message("s", "user", "one")
    db.append_message("s", "assistant", "two")
    assert seen == [(1, True), (2, True)]


@pytest.mark.parametrize("write", ["append", "batch", "create", "title", "replace", "meta", "end"])
def test_a_pre_commit_hook_vetoes_the_write(db, write: str) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "kept before the hook")
    before = (db.get_session("s"), db.get_messages("s"), db.get_meta("k"), db.get_session("t"))
    calls: list[str] = []
    post: list[str] = []

    def veto(conn) -> None:
        calls.append("pre")
        raise Veto("no")

    db.add_pre_commit_hook(veto)
    db.add_post_write_hook(lambda: post.append("post"))
    action = {
        "append": lambda: db.append_message("s", "user", "vetoed"),
        "batch": lambda: db.append_messages_batch("s", [{"role": "user", "content": f"b{i}"} for i in range(5)]),
        "create": lambda: db.create_session("t", "cli"),
        "title": lambda: db.set_session_title("s", "a title"),
        "replace": lambda: db.replace_messages("s", [{"role": "user", "content": "replaced"}]),
        "meta": lambda: db.set_meta("k", "v"),
        "end": lambda: db.end_session("s", "user_exit"),
    }[write]
    with pytest.raises(Veto):
        action()
    assert calls == ["pre"]  # not retried: a veto is final
    assert post == []  # never after a rollback
    assert (db.get_session("s"), db.get_messages("s"), db.get_meta("k"), db.get_session("t")) == before
    assert db.message_count("s") == 1
    db.clear_write_hooks()
    action()  # without the hook the same write lands
    assert post == []


def test_only_the_vetoed_write_is_lost_among_threads(db) -> None:
    """With a pre-commit hook each write has its own transaction (no group commit), so a
    veto of one append rolls back that append alone."""
    db.create_session("s", "cli")
    db.add_pre_commit_hook(
        lambda conn: (_ for _ in ()).throw(Veto()) if _count(
            conn, "SELECT count(*) FROM messages WHERE content = 't1-7'") else None)
    vetoed: list[str] = []

    def writer(t: int) -> None:
        for i in range(15):
            try:
                db.append_message("s", "user", f"t{t}-{i}")
            except Veto:
                vetoed.append(f"t{t}-{i}")

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    contents = sorted(m["content"] for m in db.get_messages("s"))
    assert vetoed == ["t1-7"]
    assert contents == sorted(f"t{t}-{i}" for t in range(4) for i in range(15) if (t, i) != (1, 7))
    assert db.get_session("s")["message_count"] == 59


# ---------------------------------------------------------------- post-write hooks


def test_a_post_write_hook_runs_after_the_commit(db, hermes_state, backend, tmp_path, request) -> None:
    db.create_session("s", "cli")
    other = hermes_state.SessionDB(db.url if backend == "postgresql" else db.db_path)
    try:
        seen: list[int] = []
        db.add_post_write_hook(lambda: seen.append(other.message_count("s")))
        db.append_message("s", "user", "one")
        db.append_messages_batch("s", [{"role": "user", "content": "two"}, {"role": "user", "content": "three"}])
        # Each hook call saw its write already committed, from another store's connection.
        assert seen == [1, 3]
    finally:
        other.close()


def test_a_failing_write_runs_no_post_write_hook(db) -> None:
    post: list[str] = []
    db.add_post_write_hook(lambda: post.append("post"))
    db.create_session("s", "cli")
    db.end_session("s", "compression")
    assert post == ["post", "post"]
    with pytest.raises(errors.CompressionSessionClosedError):
        db.append_message("s", "user", "refused by the store itself")
    assert post == ["post", "post"]


def test_a_failing_post_write_hook_does_not_fail_the_committed_write(db, caplog) -> None:
    db.create_session("s", "cli")

    def boom() -> None:
        raise RuntimeError("observer broke")

    after: list[str] = []
    db.add_post_write_hook(boom)
    db.add_post_write_hook(lambda: after.append("ran"))
    with caplog.at_level(logging.WARNING, logger="hermes_state"):
        row = db.append_message("s", "user", "durable")
    assert isinstance(row, int)
    assert [m["content"] for m in db.get_messages("s")] == ["durable"]
    assert after == ["ran"]  # the next hook still runs
    assert "post-write hook" in caplog.text and "observer broke" in caplog.text


def test_clear_write_hooks_drops_both_kinds(db) -> None:
    calls: list[str] = []
    db.add_pre_commit_hook(lambda conn: calls.append("pre"))
    db.add_post_write_hook(lambda: calls.append("post"))
    db.create_session("s", "cli")
    assert calls == ["pre", "post"]
    db.clear_write_hooks()
    db.append_message("s", "user", "x")
    assert calls == ["pre", "post"]
    assert db._pre_commit_hooks == [] and db._post_write_hooks == []


# ---------------------------------------------------------------- the factory


def _write_config(home: Path, section: dict) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(yaml.safe_dump({"sessiondb": section}), encoding="utf-8")


@pytest.mark.sqlite_only
def test_the_factory_opens_the_file_for_sqlite(hsp, hermes_state, tmp_path, monkeypatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HERMES_HOME", str(home))
    # Whatever else the shell points at, provider sqlite means Hermes' file.
    monkeypatch.setenv("HERMES_STORE_URL", "postgresql+psycopg://nobody@127.0.0.1:1/nowhere")
    store = hsp.get_session_db_provider()  # no config.yaml: the default provider, sqlite
    try:
        assert store.name == "sqlite" and store.db_path == home / "state.db"
        store.create_session("a", "cli")
    finally:
        store.close()
    _write_config(home, {"provider": "SQLite"})
    explicit = tmp_path / "elsewhere" / "state.db"
    store = hsp.get_session_db_provider(explicit)
    try:
        assert store.db_path == explicit and store.get_session("a") is None
    finally:
        store.close()
    ro = hsp.get_session_db_provider(home / "state.db", read_only=True, config={"sessiondb": {"provider": "sqlite"}})
    try:
        assert ro.get_session("a")["id"] == "a"
        with pytest.raises(errors.ReadOnlyDatabaseError):
            ro.create_session("b", "cli")
    finally:
        ro.close()


@pytest.mark.sqlite_only
@pytest.mark.parametrize("section", [{"provider": "mongodb"}, {"provider": "sqlite3"}, {"provider": ""}])
def test_an_unknown_provider_is_refused_and_nothing_is_created(hsp, tmp_path, section) -> None:
    target = tmp_path / "state.db"
    if section["provider"] == "":
        # An empty name is the default provider (Hermes reads it the same way).
        store = hsp.get_session_db_provider(target, config={"sessiondb": section})
        assert store.name == "sqlite"
        store.close()
        return
    with pytest.raises(ValueError, match="is not available in this build") as info:
        hsp.get_session_db_provider(target, config={"sessiondb": section})
    assert isinstance(info.value, errors.HermesStoreError)
    assert not target.exists()


@pytest.mark.sqlite_only
@pytest.mark.parametrize("config, message", [
    ({"sessiondb": {"provider": "postgresql"}}, "sessiondb.postgresql.url"),
    ({"sessiondb": {"provider": "postgresql", "postgresql": "a string"}}, "must be a mapping"),
    ({"sessiondb": {"provider": "postgresql", "postgresql": {"url_env": "HS_TEST_UNSET_URL"}}}, "not set"),
    ({"sessiondb": {"provider": "postgresql", "postgresql": {"url": "postgresql://x/y", "schema": 3}}},
     "schema must be a string"),
    ({"sessiondb": ["provider", "sqlite"]}, "must be a mapping"),
    ("sqlite", "config must be a mapping"),
])
def test_bad_provider_settings_get_a_typed_error(hsp, tmp_path, monkeypatch, config, message) -> None:
    monkeypatch.delenv("HS_TEST_UNSET_URL", raising=False)
    with pytest.raises(errors.ProviderConfigError, match=message):
        hsp.get_session_db_provider(tmp_path / "state.db", config=config)
    assert not (tmp_path / "state.db").exists()


def test_the_factory_reaches_postgresql_from_config_yaml(hsp, hermes_state, pg_database, tmp_path,
                                                        monkeypatch) -> None:
    url = pg_database
    home = tmp_path / "home"
    monkeypatch.setenv("HERMES_HOME", str(home))
    monkeypatch.setenv("HS_TEST_PG_URL", url)
    _write_config(home, {"provider": "postgresql", "postgresql": {"url_env": "HS_TEST_PG_URL"}})
    store = hsp.get_session_db_provider(tmp_path / "ignored.db")
    try:
        assert store.name == "postgresql" and store.db_path is None
        assert isinstance(store, hsp.SessionDBProvider)
        store.create_session("via-config", "telegram")
        store.append_message("via-config", "user", "reached through Hermes' switch")
    finally:
        store.close()
    assert not (tmp_path / "ignored.db").exists()
    # The same server, named directly, with a tenant schema as config.yaml can give one.
    section = {"provider": "postgres", "postgresql": {"url": url, "schema": "team_cfg"}}
    tenant = hsp.get_session_db_provider(config={"sessiondb": section})
    plain = hermes_state.SessionDB(url)
    try:
        assert plain.get_messages("via-config")[0]["content"] == "reached through Hermes' switch"
        tenant.create_session("tenant-only", "cli")
        assert tenant.get_session("via-config") is None and plain.get_session("tenant-only") is None
    finally:
        tenant.close()
        plain.close()


# ---------------------------------------------------------------- Hermes v30's own switch, end to end

V30_APP = Path(__file__).resolve().parents[1] / "data" / "hermes_v30_app"


def _run_v30_caller(tmp_path: Path, section: dict, extra_env: dict[str, str] | None = None) -> dict:
    """Run ``tests/data/hermes_v30_app/v30_caller.py`` in a fresh interpreter whose path
    holds only the two one-line swap files (``hermes_state.py``, ``hermes_state_provider.py``)."""
    home = tmp_path / "hermes-home"
    _write_config(home, section)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")}
    env.update({"HERMES_HOME": str(home), "PYTHONPATH": os.pathsep.join(
        [str(V30_APP), str(Path(__file__).resolve().parents[2])])}, **(extra_env or {}))
    proc = subprocess.run([sys.executable, str(V30_APP / "v30_caller.py")], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check_v30_run(out: dict, name: str) -> None:
    assert out["name"] == name and out["available"] is True and out["after_shutdown"] is False
    assert out["vetoed"] is True
    assert out["messages"] == ["hello from v30"]
    assert out["events"] == ["committed", "committed"]  # create + first append; none for the veto
    assert out["found"] == ["v30"]
    assert out["same_class"] is True


@pytest.mark.sqlite_only
def test_hermes_v30_code_runs_on_the_file_through_its_own_switch(tmp_path: Path) -> None:
    out = _run_v30_caller(tmp_path, {"provider": "sqlite"})
    _check_v30_run(out, "sqlite")
    assert (tmp_path / "hermes-home" / "state.db").exists()


def test_hermes_v30_code_reaches_postgresql_through_its_own_switch(tmp_path: Path, pg_database: str,
                                                                   hermes_state) -> None:
    out = _run_v30_caller(tmp_path, {"provider": "postgresql", "postgresql": {"url": pg_database}})
    _check_v30_run(out, "postgresql")
    assert not (tmp_path / "hermes-home" / "state.db").exists()
    store = hermes_state.SessionDB(pg_database)
    try:
        assert [m["content"] for m in store.get_messages("v30")] == ["hello from v30"]
    finally:
        store.close()


def test_the_readme_swap_files_are_the_ones_run_here() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    for name in ("hermes_state.py", "hermes_state_provider.py"):
        block = readme.split(f"<!-- host-example: hermes-v30/{name} -->", 1)[1].split("```python\n", 1)[1]
        assert block.split("```", 1)[0] == (V30_APP / name).read_text(encoding="utf-8")


REFERENCE = Path(__file__).resolve().parents[1] / "data" / "reference" / "SESSIONDB_V30_PROVIDER.md"
_MEMBER = re.compile(r"`(?P<name>\w+)(?:\((?P<params>[^)]*)\))?[^`]*`")


def _members() -> list[tuple[str, list[str]]]:
    """(name, parameters) of every member in the reference's members table."""
    found = []
    for line in REFERENCE.read_text(encoding="utf-8").splitlines():
        cells = line.split("|")
        if len(cells) < 4 or not cells[2].strip().startswith("`"):
            continue
        for m in _MEMBER.finditer(cells[2]):
            params = [p.strip() for p in (m.group("params") or "").split(",") if p.strip()]
            found.append((m.group("name"), params))
    return found


def test_every_member_of_the_reference_is_there_with_its_parameters(hsp, hermes_state) -> None:
    members = _members()
    assert len(members) == 29  # the table's members, the three hooks included
    for name, params in members:
        assert hasattr(hsp.SessionDBProvider, name), name
        ours = getattr(hermes_state.SessionDB, name)
        if isinstance(ours, property):
            continue
        sig = inspect.signature(ours)
        for param in params:
            if param.startswith("**"):
                continue
            pname, _, default = param.partition("=")
            assert pname in sig.parameters, f"{name}: no parameter {pname}"
            if default:
                assert sig.parameters[pname].default == ast.literal_eval(default), f"{name}: {pname} default"
