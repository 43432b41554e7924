"""Every statement names its tenant schema: nothing depends on a connection's search_path.

Behind a transaction pooler a server connection passes from client to client, so a
store never points a connection at its tenant; each statement names the schema
itself (:mod:`hermes_store.tenant_schema`). Shown here by making every unqualified name fail:
the database's ``search_path`` is set to a schema that does not exist (or to a decoy
tenant's), new connections pick it up, and then the whole SessionDB surface runs on
tenant ``team_a``, directly and through the PgBouncer in front of the test server.
Every answer is checked, and the decoy ``team_b`` and the store in ``public`` must end
byte for byte as they were (row counts and a content checksum per table).

Also here: upkeep that runs after a commit (short-CJK index catch-up, periodic FTS
merges) never turns a committed write into an error, on both backends.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy import text

from hermes_store import SessionDB, migrations
from hermes_store import facade
from hermes_store.repositories import MaintenanceRepository
from hermes_store.dialects import cjk_bigram as bigram
from hermes_store.dialects import cjk_bigram as bigram_upkeep

from .helpers import hostile_search_path, server_database, via_pooler

#: A schema nobody made: an unqualified name on a new connection is "relation does not exist".
NOWHERE = "'nowhere_at_all'"
#: The decoy first: an unqualified name would silently read or write team_b instead.
DECOY = "team_b, public"


def _fill(db: SessionDB, tag: str) -> None:
    """A few rows a store keeps, different per store (so a leak shows in a checksum)."""
    db.create_session(f"{tag}-1", "cli", model=f"{tag}-model", system_prompt=f"{tag} prompt")
    db.set_session_title(f"{tag}-1", f"{tag} deploy plan")
    db.append_message(f"{tag}-1", "user", f"{tag} deploy the 数据库 service")
    db.append_message(f"{tag}-1", "assistant", "数据 ok", tool_calls=[{"function": {"name": "terminal"}}])
    db.update_token_counts(f"{tag}-1", input_tokens=7, output_tokens=3, model=f"{tag}-model")
    db.set_meta(f"{tag}.key", tag)
    db.index_search()


def _snapshot(direct_url: str, schema: str) -> dict[str, tuple[int, str]]:
    """Per table of ``schema``: (rows, md5 of every row's text in a fixed order), read
    with names qualified by hand on a connection of its own."""
    engine = sa_create_engine(direct_url)
    try:
        with engine.connect() as conn:
            tables = conn.execute(
                text("SELECT tablename FROM pg_tables WHERE schemaname = :s ORDER BY tablename"), {"s": schema}
            ).scalars().all()
            out = {}
            for t in tables:
                q = f'"{schema}"."{t}"'
                out[t] = tuple(conn.execute(text(
                    f"SELECT count(*), md5(COALESCE(string_agg(x::text, '|' ORDER BY x::text), '')) FROM {q} x"
                )).one())
            return out
    finally:
        engine.dispose()


@contextmanager
def _hostile_database(pg_url: str, search_path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """A database with tenants team_a (empty at head), team_b and public (filled), whose
    ``search_path`` is then ``search_path`` for every new connection. Yields the direct
    URL and the snapshots of team_b and public taken before."""
    with server_database(pg_url) as url:
        migrations.upgrade(url, schema="team_a")
        for schema, tag in (("team_b", "b"), (None, "p")):
            with SessionDB(url, schema=schema) as db:
                _fill(db, tag)
        before = {"team_b": _snapshot(url, "team_b"), "public": _snapshot(url, "public")}
        assert before["team_b"]["messages"][0] == 2 and before["public"]["sessions"][0] == 1
        hostile_search_path(url, search_path)
        yield url, before


def _check_path_is_hostile(url: str, search_path: str) -> None:
    """A new connection really has the hostile path (else the workout proves nothing)."""
    engine = sa_create_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW search_path").scalar() == search_path.strip("'")
    finally:
        engine.dispose()


def _titles(db: SessionDB) -> None:
    assert db.set_session_title("a-1", "Deploy plan")
    assert db.get_session_title("a-1") == "Deploy plan"
    assert db.get_session_by_title("Deploy plan")["id"] == "a-1"
    assert db.resolve_session_by_title("Deploy plan") == "a-1"
    assert db.get_next_title_in_lineage("Deploy plan") == "Deploy plan #2"
    # team_b and public have "b deploy plan" / "p deploy plan": never seen from here.
    assert db.get_session_by_title("b deploy plan") is None
    assert db.resolve_session_by_title("p deploy plan") is None
    assert db.set_auto_title_if_empty("a-2", "Auto named")
    assert db.get_session_title("a-2") == "Auto named"


def _messages(db: SessionDB) -> dict[str, int]:
    ids = {
        "plain": db.append_message("a-1", "user", "please deploy the payment service tonight"),
        "cjk": db.append_message("a-1", "assistant", "数据库连接失败，请检查数据配置"),
        "tool": db.append_message(
            "a-1", "assistant", "running it",
            tool_calls=[{"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": "{}"}}],
        ),
        "result": db.append_message("a-1", "tool", "exit 0", tool_name="terminal", tool_call_id="c1"),
        "nul": db.append_message("a-1", "user", "before\x00after"),
    }
    assert all(isinstance(i, int) and i > 0 for i in ids.values())
    rows = db.get_messages("a-1")
    assert [r["id"] for r in rows] == sorted(ids.values())
    assert rows[-1]["content"] == "before\x00after"
    assert rows[2]["tool_calls"][0]["function"]["name"] == "terminal"
    assert db.message_count("a-1") == 5
    assert db.get_session("a-1")["message_count"] == 5
    assert db.get_session("a-1")["tool_call_count"] == 1
    conv = db.get_messages_as_conversation("a-1")
    assert [m["role"] for m in conv] == ["user", "assistant", "assistant", "tool", "user"]
    around = db.get_messages_around("a-1", ids["tool"], window=1)
    assert [m["id"] for m in around["window"]] == [ids["cjk"], ids["tool"], ids["result"]]
    view = db.get_anchored_view("a-1", ids["cjk"], window=1)
    assert ids["cjk"] in [m["id"] for m in view["window"]]
    assert db.has_platform_message_id("a-1", "nope") is False
    assert [r["id"] for r in db.list_recent_user_messages("a-1")] == [ids["nul"], ids["plain"]]
    assert db.set_latest_user_api_content("a-1", "before\x00after", "api text") == 1
    # a session of its own for replace / clear / rewind
    db.create_session("a-3", "cli")
    db.append_messages([{"session_id": "a-3", "role": "user", "content": f"bulk {i}"} for i in range(70)])
    assert db.message_count("a-3") == 70
    db.replace_messages("a-3", [{"role": "user", "content": "only one"}, {"role": "assistant", "content": "ok"}])
    assert [m["content"] for m in db.get_messages("a-3")] == ["only one", "ok"]
    first = db.get_messages("a-3")[0]["id"]
    assert db.rewind_to_message("a-3", first)["rewound_count"] == 2
    assert db.get_messages("a-3") == [] and db.has_archived_messages("a-3")
    assert db.restore_rewound("a-3", first) == 2
    assert db.archive_and_compact("a-3", [{"role": "user", "content": "summary"}]) == 1
    db.clear_messages("a-3")
    assert db.message_count("a-3") == 0 and db.get_session("a-3")["message_count"] == 0
    return ids


def _lineage(db: SessionDB) -> None:
    db.create_session("a-4", "cli")
    db.append_message("a-4", "user", "first turn of the chain")
    db.end_session("a-4", "compression")
    db.create_session("a-5", "cli", parent_session_id="a-4")
    db.append_message("a-5", "user", "continued after compression")
    assert db.get_compression_tip("a-4") == "a-5"
    assert db.resolve_resume_session_id("a-4") == "a-5"
    assert db.get_session_lineage("a-5")[:2] == ["a-4", "a-5"] or "a-4" in db.get_session_lineage("a-5")
    assert db.get_session_ancestors("a-5")[0] == "a-4" or "a-4" in db.get_session_ancestors("a-5")
    assert "a-5" in db.get_session_descendants("a-4")
    assert db.get_conversation_root("a-5") == "a-4"
    model, display = db.get_resume_conversations("a-5")
    assert [m["content"] for m in display] == ["first turn of the chain", "continued after compression"]
    assert [m["content"] for m in model] == ["continued after compression"]
    assert [m["content"] for m in db.get_ancestor_display_prefix("a-5")] == ["first turn of the chain"]
    assert db.get_messages_as_conversation("a-5", include_ancestors=True)[0]["content"] == "first turn of the chain"
    assert "a-4" in db.get_compression_lineage("a-5") or "a-5" in db.get_compression_lineage("a-4")
    assert db.export_session_lineage("a-5") is not None


def _search(db: SessionDB, ids: dict[str, int]) -> None:
    def found(query: str, **kw: Any) -> set[int]:
        return {h["id"] for h in db.search_messages(query, **kw)}

    assert ids["plain"] in found("deploy")
    assert ids["plain"] in found('"payment service"')
    assert ids["plain"] in found("paym*")
    assert found("数据") >= {ids["cjk"]}  # two characters: the bigram blocks or a scan
    assert found("数据库") == {ids["cjk"]}
    assert ids["tool"] in found("terminal") or ids["result"] in found("terminal")
    assert found("deploy", role_filter=["assistant"]) == set()
    # A word outside ASCII is folded by our SQL function, called in the tenant's schema.
    db.create_session("a-6", "cli")
    cafe = db.append_message("a-6", "user", "Le Café est ouvert")
    assert found("café") == {cafe} and found("CAFÉ ouvert") == {cafe}
    hit = db.search_messages("payment")[0]
    assert ">>>payment<<<" in hit["snippet"] and hit["context"]
    # the decoys' words are never found here
    assert all(h["session_id"].startswith("a-") for h in db.search_messages("deploy"))
    assert db.index_search() >= 0
    assert found("数据") >= {ids["cjk"]}  # again, now from the caught-up index


def _listing(db: SessionDB) -> None:
    rich = db.list_sessions_rich(limit=50)
    assert {r["id"] for r in rich} >= {"a-1", "a-2"}
    assert all(r["id"].startswith("a-") for r in rich)
    assert "a-1" in {r["id"] for r in db.list_sessions_rich(search_query="Deploy")}
    assert {r["id"] for r in db.search_sessions(limit=50)} >= {"a-1", "a-2"}
    assert db.search_sessions_by_id("a-1")[0]["id"] == "a-1"
    assert db.resolve_session_id("a-2") == "a-2"
    assert db.session_count() == len(db.search_sessions(limit=1000))
    assert db.session_count(source="telegram") == 1
    assert db.message_count() == sum(db.message_count(s["id"]) for s in db.search_sessions(limit=1000))
    assert db.distinct_session_cwds() == [] or isinstance(db.distinct_session_cwds(), list)


def _usage(db: SessionDB) -> None:
    db.update_token_counts("a-1", input_tokens=100, output_tokens=20, model="gpt-x", billing_provider="openai",
                           estimated_cost_usd=0.5)
    db.update_token_counts("a-1", input_tokens=1, output_tokens=1, model="gpt-x", billing_provider="openai",
                           estimated_cost_usd=0.25)
    db.record_auxiliary_usage("a-1", "title", model="small", input_tokens=5)
    s = db.get_session("a-1")
    assert (s["input_tokens"], s["output_tokens"]) == (101, 21)
    by_model = {row.key[0]: row for row in db.usage("model")}
    assert by_model["gpt-x"].input_tokens == 101  # from the ledger
    assert "small" in by_model
    db.update_session_billing_route("a-1", provider="openai", base_url="https://x", billing_mode="api")
    db.update_session_model("a-1", "gpt-y")
    db.update_session_meta("a-1", json.dumps({"k": 1}), model="gpt-z")
    db.update_session_cwd("a-1", "/work/a", git_branch="main")
    db.update_system_prompt("a-1", "a new prompt")
    db.update_session("a-1", user_id="u1")
    s = db.get_session("a-1")
    assert (s["model"], s["cwd"], s["system_prompt"], s["user_id"]) == ("gpt-z", "/work/a", "a new prompt", "u1")
    assert db.record_session_activity("a-1", "typing", "test")


def _gateway(db: SessionDB) -> None:
    db.record_gateway_session_peer("a-2", source="telegram", user_id="u9", session_key="sk9", chat_id="c9",
                                   chat_type="dm")
    db.append_message("a-2", "user", "hello from telegram")
    peer = db.find_latest_gateway_session_for_peer(source="telegram", user_id="u9", session_key="sk9",
                                                   chat_id="c9", chat_type="dm")
    assert peer is not None and peer["id"] == "a-2"
    assert db.find_session_by_origin(platform="telegram", chat_id="c9", user_id="u9") in ("a-2", None)
    assert isinstance(db.list_gateway_sessions(platform="telegram", active_only=False), list)
    db.save_gateway_routing_entry("k1", '{"a": 1}')
    db.replace_gateway_routing_entries({"k2": "{}", "k3": "[]"}, scope="s")
    assert db.load_gateway_routing_entries() == {"k1": '{"a": 1}'}
    assert db.load_gateway_routing_entries(scope="s") == {"k2": "{}", "k3": "[]"}
    db.delete_gateway_routing_entries(["k2"], scope="s")
    assert db.load_gateway_routing_entries(scope="s") == {"k3": "[]"}
    db.set_expiry_finalized("a-2")
    assert db.promote_to_session_reset("a-2") in (True, False)


def _compression(db: SessionDB) -> None:
    assert db.try_acquire_compression_lock("a-1", "me", 60)
    assert not db.try_acquire_compression_lock("a-1", "you", 60)
    assert db.get_compression_lock_holder("a-1") == "me"
    assert db.refresh_compression_lock("a-1", "me", 60)
    db.release_compression_lock("a-1", "me")
    assert db.get_compression_lock_holder("a-1") is None
    db.record_compression_failure_cooldown("a-1", 4e9, "too big")
    assert db.get_compression_failure_cooldown("a-1")["error"] == "too big"
    db.clear_compression_failure_cooldown("a-1")
    assert db.get_compression_failure_cooldown("a-1") is None
    db.set_compression_fallback_streak("a-1", 3)
    assert db.get_compression_fallback_streak("a-1") == 3


def _telegram(db: SessionDB) -> None:
    assert db.apply_telegram_topic_migration() is True
    assert db.has_telegram_topic_schema()
    assert db.set_telegram_dm_topic_mode(chat_id="c1", enabled=True) == 1
    assert db.get_telegram_dm_topic_mode(chat_id="c1") is True
    assert db.bind_telegram_topic(
        chat_id="c1", thread_id="t1", user_id="u1", session_key="k1", session_id="a-1"
    ) is None
    assert db.get_telegram_topic_binding(chat_id="c1", thread_id="t1")["session_id"] == "a-1"
    assert len(db.list_telegram_topic_bindings(chat_id="c1")) == 1
    assert len(db.get_telegram_topic_bindings_for_session(session_id="a-1")) == 1
    assert db.touch_telegram_topic_binding(chat_id="c1", thread_id="t1", title="renamed") == 1
    assert db.delete_telegram_topic_binding(chat_id="c1", thread_id="t1") == 1


def _housekeeping(db: SessionDB, tmp: Path) -> None:
    exported = db.export_session("a-1")
    assert exported["id"] == "a-1" and len(exported["messages"]) == 5
    everything = db.export_all()
    assert {r["id"] for r in everything} >= {"a-1", "a-4", "a-5"}
    assert all(r["id"].startswith("a-") for r in everything)
    assert len(list(db.iter_export())) == len(everything)
    copy = dict(exported, id="a-import", title=None)
    copy["messages"] = [{k: v for k, v in m.items() if k != "id"} for m in exported["messages"]]
    result = db.import_sessions([copy])
    assert result["imported"] == 1, result
    assert db.message_count("a-import") == 5
    assert db.import_records([dict(copy, id="a-import2")]) == (1, 0)
    # Ids kept when free: checked, then the identity moved past them (sync_identity).
    kept = [dict(m, id=100_000 + i) for i, m in enumerate(copy["messages"])]
    assert db.import_records([dict(copy, id="a-import3", messages=kept)]) == (1, 0)
    assert [m["id"] for m in db.get_messages("a-import3")] == [m["id"] for m in kept]
    assert db.append_message("a-import3", "user", "after the kept ids") > 100_004
    assert db.delete_session("a-import3")
    assert db.set_session_archived("a-import2", True)
    assert db.session_count(archived_only=True) == 1
    db.create_session("a-empty", "cli")
    db.end_session("a-empty", "done")
    assert db.count_empty_sessions() == 1  # ended, no messages
    db.reopen_session("a-empty")
    assert db.get_session("a-empty")["ended_at"] is None
    assert db.count_empty_sessions() == 0
    assert db.delete_session_if_empty("a-empty")
    assert db.get_session("a-empty") is None
    assert db.delete_session("a-import", sessions_dir=tmp)
    assert db.get_session("a-import") is None
    assert db.delete_sessions(["a-import2"]) == 1
    # pruning: one old ended session
    db.create_session("a-old", "cron")
    db.append_message("a-old", "user", "old run")
    db.end_session("a-old", "done")
    db._write(lambda c: c.execute(
        MaintenanceRepository(c)._sql("UPDATE {sessions} SET started_at = 1, ended_at = 2 WHERE id = 'a-old'")
    ))
    db._write(lambda c: c.execute(  # v26: prune reads inactivity (the newest message), so age it too
        MaintenanceRepository(c)._sql("UPDATE {messages} SET timestamp = 2 WHERE session_id = 'a-old'")
    ))
    assert [r["id"] for r in db.list_prune_candidates(older_than_days=30)] == ["a-old"]
    assert [r["id"] for r in db.prune_candidates(30)] == ["a-old"]
    assert db.prune_sessions(older_than_days=30) == 1
    assert db.get_session("a-old") is None
    assert db.prune_empty_ghost_sessions() == 0
    assert db.finalize_orphaned_compression_sessions() == 0
    assert db.archive_sessions(older_than_days=36500) == 0
    db.create_session("a-empty2", "cli")
    db.end_session("a-empty2", "done")
    assert db.delete_empty_sessions() == 1
    assert db.get_session("a-empty2") is None
    out = db.maybe_auto_prune_and_vacuum(retention_days=36500, min_interval_hours=0, vacuum=True)
    assert isinstance(out, dict)


def _maintenance(db: SessionDB) -> None:
    db.set_meta("a.key", "va")
    assert db.get_meta("a.key") == "va"
    assert db.get_meta("b.key") is None and db.get_meta("p.key") is None
    check = db.check_fts()
    assert check and all(v is None for v in check.values()), check
    assert db.rebuild_fts() == len(check)
    assert db.optimize_fts() == len(check)
    assert sorted(db.rebuild_search_indexes()) == sorted([*check, bigram.TABLE])
    assert db.vacuum() == len(check)
    assert db.fts_rebuild_status() is None
    assert db.fts_optimize_available() is False


def _workout(url: str, tmp: Path) -> None:
    """The whole SessionDB surface on tenant team_a."""
    with SessionDB(url, schema="team_a") as db:
        assert db.create_session("a-1", "cli", model="m1", system_prompt="the system prompt") == "a-1"
        assert db.ensure_session("a-2", "telegram") == "a-2"
        assert db.get_session("a-1")["system_prompt"] == "the system prompt"
        assert db.get_session("b-1") is None and db.get_session("p-1") is None
        _titles(db)
        ids = _messages(db)
        _lineage(db)
        _search(db, ids)
        _listing(db)
        _usage(db)
        _gateway(db)
        _compression(db)
        _telegram(db)
        _housekeeping(db, tmp)
        _maintenance(db)
    # A store at head opens again (the open is a read-only check), and sees its rows.
    with SessionDB(url, schema="team_a") as db:
        assert db.get_session("a-1")["title"] == "Deploy plan"
        assert {h["id"] for h in db.search_messages("数据库")} == {ids["cjk"]}


@pytest.mark.parametrize("search_path", [NOWHERE, DECOY], ids=["nowhere", "decoy"])
@pytest.mark.parametrize("route", ["direct", "pooler"])
def test_every_statement_names_its_schema(pg_url: str, request: pytest.FixtureRequest, tmp_path: Path,
                                          search_path: str, route: str) -> None:
    with _hostile_database(pg_url, search_path) as (direct, before):
        url = via_pooler(direct, request.getfixturevalue("pgbouncer_url")) if route == "pooler" else direct
        _check_path_is_hostile(url, search_path)
        _workout(url, tmp_path)
        assert _snapshot(direct, "team_b") == before["team_b"]
        assert _snapshot(direct, "public") == before["public"]
        after = _snapshot(direct, "team_a")
        assert after["sessions"][0] >= 5 and after["messages"][0] >= 7


# ---------------------------------------------------------------------- upkeep after commit


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionDB]:
    target = tmp_path / "state.db" if request.param == "sqlite" else request.getfixturevalue("pg_database")
    with SessionDB(target) as db:
        db.create_session("s", "cli")
        yield db


def _boom(*_a: Any, **_k: Any) -> Any:
    raise RuntimeError("upkeep exploded")


@pytest.mark.parametrize("broken", ["catch_up", "catch_up_call", "optimize"])
def test_upkeep_after_a_commit_never_fails_the_write(store: SessionDB, monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture, broken: str) -> None:
    if broken == "catch_up":  # inside the maintenance transaction
        monkeypatch.setattr(bigram_upkeep, "catch_up", _boom)
        monkeypatch.setattr(bigram_upkeep, "pending", lambda _c: 1)
    elif broken == "catch_up_call":  # the facade's own catch-up step
        monkeypatch.setattr(facade.SessionDB, "_catch_up_search_index", _boom)
    else:  # Hermes' periodic optimize
        monkeypatch.setattr(facade.SessionDB, "optimize_fts", _boom)
    every = store._OPTIMIZE_EVERY_N_WRITES if broken == "optimize" else facade.CHECKPOINT_EVERY
    store._writes = every - 1  # this append is the one that runs the upkeep
    with caplog.at_level("WARNING"):
        mid = store.append_message("s", "user", "数据 still committed")
        assert store.wait_for_upkeep(30)  # a server runs it on the store's upkeep thread
    assert isinstance(mid, int) and mid > 0
    assert [m["id"] for m in store.get_messages("s")] == [mid]
    assert store.get_session("s")["message_count"] == 1
    assert any("upkeep exploded" in r.getMessage() or (r.exc_info and "upkeep exploded" in str(r.exc_info[1]))
               for r in caplog.records), caplog.text
