"""Hermes v23 §1.H: export (live rows), lineage export, and the validating import;
through the swapped ``hermes_state`` module, on both backends. Also our own full-fidelity
pair (``iter_export`` / ``import_records``) that the CLI uses."""

from __future__ import annotations

import inspect
import json
import threading
import time

import pytest

from hermes_store import errors
from hermes_store.repositories.housekeeping import HousekeepingRepository

pytestmark = pytest.mark.both_backends

E = inspect.Parameter.empty


def _params(fn) -> list[tuple[str, str, object]]:
    return [(p.name, p.kind.name, p.default) for p in inspect.signature(fn).parameters.values()]


def test_signatures_and_limits(hermes_state) -> None:
    S = hermes_state.SessionDB
    pk, kw = "POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY"
    # our extra (include_inactive) is keyword-only, after Hermes' parameters
    assert _params(S.export_session) == [("self", pk, E), ("session_id", pk, E), ("include_inactive", kw, False)]
    assert _params(S.export_all) == [("self", pk, E), ("source", pk, None), ("include_inactive", kw, False)]
    assert _params(S.export_session_lineage) == [("self", pk, E), ("session_id", pk, E)]
    assert _params(S.import_sessions) == [("self", pk, E), ("sessions", pk, E)]
    assert (S._IMPORT_MAX_SESSIONS, S._IMPORT_MAX_MESSAGES_PER_SESSION, S._IMPORT_MAX_TOTAL_MESSAGES) == (
        500, 10_000, 50_000)
    assert (S._IMPORT_MAX_SESSION_BYTES, S._IMPORT_MAX_TOTAL_BYTES) == (5 * 1024 * 1024, 25 * 1024 * 1024)


# ---------------------------------------------------------------------------- export


def _conversation(db, sid: str, *, source: str = "cli", n: int = 2, **kw) -> list[int]:
    db.create_session(sid, source, **kw)
    ids = []
    for i in range(n):
        ids.append(db.append_message(sid, "user", f"{sid} asks {i}"))
        ids.append(db.append_message(sid, "assistant", f"{sid} answers {i}",
                                     tool_calls=[{"id": f"t{i}", "function": {"name": "f", "arguments": "{}"}}]))
    return ids


def test_export_session_is_the_row_plus_live_messages(db) -> None:
    ids = _conversation(db, "s", model="m1")
    db.update_token_counts("s", input_tokens=4, output_tokens=2, model="m1", billing_provider="p")
    db.rewind_to_message("s", ids[2])  # the second user turn and its answer are rewound
    out = db.export_session("s")
    row = db.get_session("s")
    assert {k: v for k, v in out.items() if k not in ("messages", "model_usage")} == row
    assert out["messages"] == db.get_messages("s")
    assert [m["content"] for m in out["messages"]] == ["s asks 0", "s answers 0"]
    assert out["messages"][1]["tool_calls"][0]["id"] == "t0"  # decoded, as get_messages
    assert [u["model"] for u in out["model_usage"]] == ["m1"]  # ours: the usage ledger rows
    full = db.export_session("s", include_inactive=True)
    assert full["messages"] == db.get_messages("s", include_inactive=True)
    assert [m["active"] for m in full["messages"]] == [1, 1, 0, 0]
    assert db.export_session("missing") is None


def test_export_skips_compaction_archived_rows_by_default(db) -> None:
    _conversation(db, "s")
    db.archive_and_compact("s", [{"role": "user", "content": "summary"}])
    assert [m["content"] for m in db.export_session("s")["messages"]] == ["summary"]
    assert len(db.export_session("s", include_inactive=True)["messages"]) == 5


def test_export_all_follows_search_sessions(db) -> None:
    _conversation(db, "a")
    _conversation(db, "b", source="telegram")
    db.create_session("c", "cli")  # no messages
    _conversation(db, "a2")
    order = [r["id"] for r in db.search_sessions(limit=100000)]
    everything = db.export_all()
    assert [e["id"] for e in everything] == order and sorted(order) == ["a", "a2", "b", "c"]
    assert everything == [db.export_session(i) for i in order]
    assert [e["id"] for e in db.export_all(source="telegram")] == ["b"]
    assert db.export_all(source="none") == []


def _chain(db) -> None:
    """a ─compression→ b ─compression→ c; b has a delegate child d."""
    _conversation(db, "a", n=1)
    db.end_session("a", "compression")
    _conversation(db, "b", n=1, parent_session_id="a")
    db.end_session("b", "compression")
    ids = _conversation(db, "c", n=2, parent_session_id="b")
    db.rewind_to_message("c", ids[2])
    _conversation(db, "d", n=1, parent_session_id="b", model_config={"_delegate_from": "b"})


@pytest.mark.parametrize("start", ["a", "b", "c"])
def test_export_session_lineage(db, start: str) -> None:
    _chain(db)
    lineage = db.get_compression_lineage(start)
    assert lineage == ["a", "b", "c"]
    out = db.export_session_lineage(start)
    assert out["id"] == "c" and out["lineage_session_ids"] == ["a", "b", "c"]
    assert [seg["id"] for seg in out["segments"]] == ["a", "b", "c"]
    assert out["segments"] == [db.export_session(i) for i in lineage]
    assert [m["content"] for m in out["messages"]] == [
        "a asks 0", "a answers 0", "b asks 0", "b answers 0", "c asks 0", "c answers 0"]
    assert out["message_count"] == 6
    assert out["title"] == db.get_session("c")["title"] and out["model_usage"] == []


def test_export_session_lineage_edge_cases(db) -> None:
    _conversation(db, "solo", n=1)
    out = db.export_session_lineage("solo")
    assert out["lineage_session_ids"] == ["solo"] and out["message_count"] == 2
    assert out["messages"] == db.export_session("solo")["messages"]
    assert db.export_session_lineage("missing") is None
    assert db.export_session_lineage("") is None


# ---------------------------------------------------------------------------- import: validation


def _entry(sid: str, n: int = 2, **fields) -> dict:
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{sid} #{i}", "timestamp": 1000.0 + i}
            for i in range(n)]
    return {"id": sid, "source": "cli", "started_at": 1000.0, "messages": msgs, **fields}


def test_import_refuses_a_non_list_and_too_many_entries(db) -> None:
    for bad in ({"id": "x"}, (_entry("x"),), "x", None):
        with pytest.raises(ValueError, match="sessions must be a list"):
            db.import_sessions(bad)
    with pytest.raises(ValueError, match="sessions must contain at most 500 entries") as info:
        db.import_sessions([_entry(f"s{i}", 0) for i in range(501)])
    assert isinstance(info.value, errors.InvalidInputError)
    assert db.session_count() == 0


BAD_ENTRIES = [
    ("not a dict", "session must be an object", None),
    ({"messages": []}, "session id is required", None),
    ({"id": "", "messages": []}, "session id is required", None),
    ({"id": 7}, "session id is required", None),
    ({"id": "m", "messages": {"role": "user"}}, "messages must be a list", "m"),
    ({"id": "m", "messages": ["hi"]}, "messages must contain only objects", "m"),
    ({"id": "j", "model_config": "{not json"}, "model_config must be valid JSON", "j"),
    ({"id": "j", "model_config": "[1, 2]"}, "model_config must be a JSON object", "j"),
    ({"id": "j", "model_config": 5}, "model_config must be a JSON object", "j"),
    ({"id": "o", "title": object()}, "session must be JSON serializable", "o"),
    ({"id": "p", "parent_session_id": 3}, "parent_session_id must be a string", "p"),
    ({"id": "t", "title": 3}, "title must be a string", "t"),
    ({"id": "t", "billing_mode": ["x"]}, "billing_mode must be a string", "t"),
    ({"id": "r", "messages": [{"content": "x"}]}, "messages[0].role must be a non-empty string", "r"),
    ({"id": "r", "messages": [{"role": "user"}, {"role": ""}]}, "messages[1].role must be a non-empty string", "r"),
    ({"id": "f", "messages": [{"role": "tool", "tool_name": 1}]}, "messages[0].tool_name must be a string", "f"),
    ({"id": "f", "messages": [{"role": "user", "message_id": 12}]}, "messages[0].message_id must be a string", "f"),
    ({"id": "k", "messages": [{"role": "user", "token_count": "12"}]}, "token_count must be an integer", "k"),
    # ours, stricter than Hermes: numbers must be numbers
    ({"id": "n", "started_at": "yesterday"}, "started_at must be a finite number", "n"),
    ({"id": "n", "input_tokens": 1.5}, "input_tokens must be an integer", "n"),
    ({"id": "n", "messages": [{"role": "user", "timestamp": "noon"}]}, "timestamp must be a finite number", "n"),
]


@pytest.mark.parametrize("bad,message,sid", BAD_ENTRIES, ids=[m for _b, m, _s in BAD_ENTRIES])
def test_import_validation_errors_write_nothing(db, bad, message: str, sid) -> None:
    result = db.import_sessions([_entry("good"), bad])
    assert result["ok"] is False
    assert (result["imported"], result["skipped"], result["detached"]) == (0, 0, 0)
    assert len(result["errors"]) == 1
    err = result["errors"][0]
    assert err["index"] == 1 and message in err["error"]
    assert err.get("session_id") == sid
    assert db.get_session("good") is None and db.session_count() == 0


def test_import_collects_every_error(db) -> None:
    result = db.import_sessions([_entry("a"), _entry("a"), "x", _entry("b", title=5)])
    assert result["ok"] is False
    assert [(e["index"], e["error"]) for e in result["errors"]] == [
        (1, "duplicate session id"), (2, "session must be an object"), (3, "title must be a string")]
    assert result["errors"][0]["session_id"] == "a"
    assert db.session_count() == 0


def test_import_limits(db, monkeypatch) -> None:
    monkeypatch.setattr(db, "_IMPORT_MAX_MESSAGES_PER_SESSION", 3)
    result = db.import_sessions([_entry("ok", 3), _entry("big", 4)])
    assert [e["error"] for e in result["errors"]] == ["messages exceeds the per-session import limit"]
    monkeypatch.setattr(db, "_IMPORT_MAX_TOTAL_MESSAGES", 5)
    result = db.import_sessions([_entry("a", 3), _entry("b", 3)])
    assert [(e["index"], e["error"]) for e in result["errors"]] == [(1, "messages exceeds the total import limit")]
    size = len(json.dumps(_entry("a", 3), ensure_ascii=False, separators=(",", ":")).encode())
    monkeypatch.setattr(db, "_IMPORT_MAX_SESSION_BYTES", size)
    assert db.import_sessions([_entry("a", 3)])["ok"] is True  # exactly at the limit passes
    result = db.import_sessions([_entry("b", 3, title="longer")])
    assert [e["error"] for e in result["errors"]] == ["session exceeds the import size limit"]
    monkeypatch.setattr(db, "_IMPORT_MAX_TOTAL_BYTES", 2 * size - 1)
    result = db.import_sessions([_entry("c", 3), _entry("d", 3)])
    assert [(e["index"], e["error"]) for e in result["errors"]] == [(1, "import exceeds the total size limit")]
    assert db.session_count() == 1  # only "a"


# ---------------------------------------------------------------------------- import: writing


def test_import_success_shape_fields_and_resets(db) -> None:
    before = time.time()
    entry = _entry(
        "full", 3, source="telegram", user_id="u1", model="m", model_config={"temperature": 0.5},
        system_prompt="be brief", ended_at=2000.0, end_reason="done", input_tokens=10, output_tokens=5,
        cache_read_tokens=1, cache_write_tokens=2, reasoning_tokens=3, billing_provider="prov",
        billing_base_url="https://x", billing_mode="paid", estimated_cost_usd=0.25, actual_cost_usd=0.2,
        cost_status="ok", cost_source="api", pricing_version="v1", cwd="/w", git_branch="main",
        git_repo_root="/w", title="Imported", api_call_count=4, archived=True,
        # not imported: gateway peer, handoff and rewind state, counters (recomputed)
        session_key="key", chat_id="c", chat_type="dm", thread_id="t", display_name="D", origin_json="{}",
        handoff_state="pending", handoff_platform="x", rewind_count=5, message_count=99, tool_call_count=42,
    )
    minimal = {"id": "min", "messages": [{"role": "user", "content": "hi"}]}
    result = db.import_sessions([entry, minimal])
    assert result == {"ok": True, "imported": 2, "skipped": 0, "detached": 0, "imported_ids": ["full", "min"],
                      "skipped_ids": [], "errors": [], "titles_cleared": []}
    row = db.get_session("full")
    expect = {k: entry[k] for k in (
        "source", "user_id", "model", "system_prompt", "ended_at", "end_reason", "input_tokens", "output_tokens",
        "cache_read_tokens", "cache_write_tokens", "reasoning_tokens", "billing_provider", "billing_base_url",
        "billing_mode", "estimated_cost_usd", "actual_cost_usd", "cost_status", "cost_source", "pricing_version",
        "cwd", "git_branch", "git_repo_root", "title", "api_call_count", "started_at")}
    assert {k: row[k] for k in expect} == expect
    assert json.loads(row["model_config"]) == {"temperature": 0.5} and row["archived"] == 1
    for key in ("session_key", "chat_id", "chat_type", "thread_id", "display_name", "origin_json",
                "handoff_state", "handoff_platform", "parent_session_id"):
        assert row[key] is None, key
    assert (row["rewind_count"], row["message_count"], row["tool_call_count"]) == (0, 3, 0)
    mini = db.get_session("min")
    assert mini["source"] == "import" and before - 1 <= mini["started_at"] <= time.time() + 1
    assert mini["message_count"] == 1


def test_import_messages_become_live_and_keep_their_timestamps(db) -> None:
    details = [{"type": "summary", "text": "thinking"}]
    msgs = [
        {"id": 900, "role": "user", "content": "old", "timestamp": 10.0, "active": 0, "message_id": "tg-1"},
        {"role": "assistant", "content": None, "timestamp": 11.5, "compacted": 1,
         "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
         "reasoning_details": json.dumps(details), "codex_reasoning_items": details},
        {"role": "tool", "content": "result", "tool_call_id": "c", "tool_name": "f", "timestamp": 12.0,
         "token_count": 7, "platform_message_id": "own", "message_id": "ignored"},
        {"role": "user", "content": [{"type": "text", "text": "multimodal"}], "timestamp": 13.0},
    ]
    assert db.import_sessions([{"id": "s", "messages": msgs}])["imported"] == 1
    rows = db.get_messages("s", include_inactive=True)
    assert [(m["active"], m["compacted"]) for m in rows] == [(1, 0)] * 4
    assert [m["timestamp"] for m in rows] == [10.0, 11.5, 12.0, 13.0]
    assert rows[0]["platform_message_id"] == "tg-1" and rows[2]["platform_message_id"] == "own"
    assert rows[2]["token_count"] == 7 and rows[3]["content"] == [{"type": "text", "text": "multimodal"}]
    # a JSON string and the same value as a list are stored identically (no double encoding)
    assert json.loads(rows[1]["reasoning_details"]) == details
    assert rows[1]["reasoning_details"] == rows[1]["codex_reasoning_items"]
    row = db.get_session("s")
    assert (row["message_count"], row["tool_call_count"]) == (4, 1)


def test_import_skips_existing_ids(db) -> None:
    db.create_session("here", "cli", model="kept")
    result = db.import_sessions([_entry("here", model="other"), _entry("new")])
    assert (result["imported"], result["skipped"]) == (1, 1)
    assert (result["imported_ids"], result["skipped_ids"]) == (["new"], ["here"])
    assert db.get_session("here")["model"] == "kept" and db.get_messages("here") == []
    again = db.import_sessions([_entry("new")])
    assert (again["imported"], again["skipped"], again["skipped_ids"]) == (0, 1, ["new"])


def test_import_restores_parent_links_or_detaches(db) -> None:
    db.create_session("in_db", "cli")
    batch = [
        _entry("child_first", parent_session_id="later_parent"),  # parent comes later in the batch
        _entry("later_parent"),
        _entry("of_db", parent_session_id="in_db"),
        _entry("lost", parent_session_id="nowhere"),
        _entry("selfish", parent_session_id="selfish"),
        _entry("x", parent_session_id="y"),  # x → y → x would be a cycle
        _entry("y", parent_session_id="x"),
        _entry("empty_parent", parent_session_id=""),
    ]
    result = db.import_sessions(batch)
    assert result["ok"] is True and result["imported"] == 8 and result["detached"] == 3
    parent = {e["id"]: db.get_session(e["id"])["parent_session_id"] for e in batch}
    assert parent == {"child_first": "later_parent", "later_parent": None, "of_db": "in_db", "lost": None,
                      "selfish": None, "x": "y", "y": None, "empty_parent": None}


def test_import_title_clash_is_imported_untitled_not_aborted(db) -> None:
    db.create_session("holder", "cli")
    db.set_session_title("holder", "Taken")
    result = db.import_sessions([
        _entry("clash", title="Taken"),
        _entry("first", title="Twice"),
        _entry("second", title="Twice"),
        _entry("fine", title="Free"),
    ])
    assert result["ok"] is True and result["imported"] == 4
    assert result["titles_cleared"] == ["clash", "second"]
    titles = {s: db.get_session(s)["title"] for s in ("holder", "clash", "first", "second", "fine")}
    assert titles == {"holder": "Taken", "clash": None, "first": "Twice", "second": None, "fine": "Free"}
    assert db.get_messages("clash")[0]["content"] == "clash #0"


def test_import_is_one_transaction(db, monkeypatch) -> None:
    original = HousekeepingRepository._ancestors

    def broken(self, sid):
        raise RuntimeError("power cut")

    monkeypatch.setattr(HousekeepingRepository, "_ancestors", broken)
    with pytest.raises(RuntimeError):
        db.import_sessions([_entry("p"), _entry("c", parent_session_id="p")])
    assert db.session_count() == 0 and db.message_count() == 0
    monkeypatch.setattr(HousekeepingRepository, "_ancestors", original)
    assert db.import_sessions([_entry("p"), _entry("c", parent_session_id="p")])["imported"] == 2


def _wipe(db) -> None:
    ids = [r["id"] for r in db.search_sessions(limit=100000)]
    assert db.delete_sessions(ids) == len(ids) and db.search_sessions(limit=10) == []


def test_hermes_export_import_round_trip(db) -> None:
    _chain(db)
    db.set_session_title("a", "Chain start")
    db.update_token_counts("c", input_tokens=7, output_tokens=1, model="m", billing_provider="p")
    exported = db.export_all()
    _wipe(db)
    result = db.import_sessions(exported)
    assert result["ok"] and result["imported"] == 4 and result["detached"] == 0
    again = db.export_all()
    assert [e["id"] for e in again] == [e["id"] for e in exported]
    same = ("id", "source", "title", "model", "model_config", "started_at", "ended_at", "end_reason",
            "parent_session_id", "input_tokens", "output_tokens", "billing_provider")
    for a, b in zip(exported, again, strict=True):
        assert {k: a[k] for k in same} == {k: b[k] for k in same}, a["id"]
        assert b["message_count"] == len(a["messages"])  # recomputed from the live rows
        strip = ("id", "session_id", "display_order")  # derived from the new ids
        assert [{k: v for k, v in m.items() if k not in strip} for m in a["messages"]] == \
               [{k: v for k, v in m.items() if k not in strip} for m in b["messages"]]
    assert db.import_sessions(exported)["skipped"] == 4


# ---------------------------------------------------------------------------- ours: iter_export / import_records


def test_import_records_keeps_every_row(db) -> None:
    """The CLI's pair keeps rewound and archived rows, ids and usage rows (a backup)."""
    _chain(db)
    db.update_token_counts("c", input_tokens=7, output_tokens=1, model="m", billing_provider="p")
    records = list(db.iter_export())
    assert sum(len(r["messages"]) for r in records) == db.message_count()  # inactive rows too
    assert any(m["active"] == 0 for r in records for m in r["messages"])
    _wipe(db)
    assert db.import_records(reversed(records)) == (4, 0)
    assert list(db.iter_export()) == records
    assert db.import_records(records, batch=1) == (0, 4)
    new_id = db.append_message("c", "user", "after the import")  # identity continues past kept ids
    assert new_id > max(m["id"] for r in records for m in r["messages"])


# ---------------------------------------------------------------------------- concurrent imports


def _second_store(db):
    return type(db)(db.db_path) if db.db_path is not None else type(db)(db.url.render_as_string(hide_password=False))


def test_concurrent_imports_of_one_batch_import_each_session_once(db) -> None:
    batch = [_entry(f"s{i:02d}", 3, title=f"title {i}") for i in range(30)]
    other = _second_store(db)
    results: list = [None, None]
    barrier = threading.Barrier(2)

    def run(slot: int, store) -> None:
        barrier.wait()
        try:
            results[slot] = store.import_sessions([dict(e) for e in batch])
        except Exception as exc:  # recorded: the assertion below names it
            results[slot] = exc

    try:
        threads = [threading.Thread(target=run, args=(0, db)), threading.Thread(target=run, args=(1, other))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        other.close()
    assert all(isinstance(r, dict) and r["ok"] for r in results), results
    assert results[0]["imported"] + results[1]["imported"] == 30
    assert results[0]["skipped"] + results[1]["skipped"] == 30
    assert sorted(results[0]["imported_ids"] + results[1]["imported_ids"]) == [e["id"] for e in batch]
    assert results[0]["titles_cleared"] == results[1]["titles_cleared"] == []
    for e in batch:
        row = db.get_session(e["id"])
        assert row["message_count"] == 3 and len(db.get_messages(e["id"])) == 3 and row["title"] == e["title"]


def test_concurrent_imports_racing_for_one_title(db) -> None:
    other = _second_store(db)
    results: dict = {}
    barrier = threading.Barrier(2)

    def run(sid: str, store) -> None:
        barrier.wait()
        try:
            results[sid] = store.import_sessions([_entry(sid, 50, title="Shared")])
        except Exception as exc:
            results[sid] = exc

    try:
        threads = [threading.Thread(target=run, args=("one", db)), threading.Thread(target=run, args=("two", other))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        other.close()
    assert all(isinstance(r, dict) and r["ok"] and r["imported"] == 1 for r in results.values()), results
    titles = {sid: db.get_session(sid)["title"] for sid in ("one", "two")}
    assert sorted(titles.values(), key=str) == [None, "Shared"]
    loser = next(sid for sid, t in titles.items() if t is None)
    assert results[loser]["titles_cleared"] == [loser]


def test_title_taken_between_check_and_insert_is_dropped_not_fatal(db, monkeypatch) -> None:
    """The race above made deterministic: the pre-check misses the holder, the insert
    hits the unique index, and the session is imported untitled in the same batch."""
    db.create_session("holder", "cli")
    db.set_session_title("holder", "Shared")
    real = HousekeepingRepository._title_taken
    calls = []

    def first_check_misses(self, title):
        calls.append(title)
        return False if len(calls) == 1 else real(self, title)

    monkeypatch.setattr(HousekeepingRepository, "_title_taken", first_check_misses)
    result = db.import_sessions([_entry("late", title="Shared"), _entry("next", title="Own")])
    assert result["ok"] and result["imported"] == 2 and result["titles_cleared"] == ["late"]
    assert calls[:2] == ["Shared", "Shared"]
    assert db.get_session("late")["title"] is None and db.get_session("next")["title"] == "Own"
    assert db.get_messages("late")[1]["content"] == "late #1"
