"""Hostile content: nothing corrupts the file or loses a row; what can't be kept
exactly is replaced visibly (U+FFFD), never dropped."""

from __future__ import annotations

import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_store import SessionDB
from hermes_store.errors import InvalidInputError


def integrity(db: SessionDB) -> None:
    conn = sqlite3.connect(db.db_path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    assert db.check_fts() == {"messages_fts": None, "messages_fts_trigram": None}


def test_lone_surrogates_replaced_visibly(db: SessionDB) -> None:
    db.create_session("s", "cli")
    mid = db.append_message("s", "user", "broken \ud800 half pair", tool_name="t\udfff")
    msg = db.get_messages("s")[0]
    assert msg["id"] == mid
    assert msg["content"] == "broken \ufffd half pair"
    assert msg["tool_name"] == "t\ufffd"
    assert db.search_messages("broken")[0]["id"] == mid
    integrity(db)


def test_nul_bytes_round_trip(db: SessionDB) -> None:
    db.create_session("s", "cli")
    text = "before\x00after nulbyte"
    db.append_message("s", "user", text)
    assert db.get_messages("s")[0]["content"] == text
    assert db.search_messages("nulbyte")[0]["session_id"] == "s"
    assert db.search_messages("\x00") == []
    integrity(db)


def test_invalid_json_in_json_columns_kept_as_text(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "assistant", "x", tool_calls="{not json", reasoning_details="[1,")
    msg = db.get_messages("s")[0]
    # Stored as given (nothing lost: Hermes v23 would store NULL) ...
    stored = db._execute_write(lambda c: c.execute("SELECT tool_calls FROM messages").fetchone()[0])
    assert stored == "{not json"
    # ... and read as Hermes reads bad JSON: an empty list, counting no calls.
    assert msg["tool_calls"] == [] and db.get_session("s")["tool_call_count"] == 0
    conv = db.get_messages_as_conversation("s")[0]
    assert conv["tool_calls"] == [] and conv["reasoning_details"] == "[1,"
    # corrupt multimodal marker written by someone else: read back as text, no crash
    db._execute_write(lambda c: c.execute("UPDATE messages SET content = ?", ("\x00json:{broken",)))
    assert db.get_messages("s")[0]["content"] == "\x00json:{broken"
    integrity(db)


def test_ten_megabyte_content(db: SessionDB) -> None:
    """A 10 MB message is stored whole and stays findable.

    Chosen behaviour, Hermes' since v28/v30: the word index holds only the first 8192
    characters of a *tool result* (``messages_fts_src``), so a word that appears only
    past them is not found by word search. Nothing is lost: the row reads back
    byte-for-byte, a word from its start finds it, and so does a substring (CJK)
    search for text anywhere in it. User and assistant text is indexed in full.
    """
    db.create_session("s", "cli")
    big = "needlestart " + ("lorem ipsum " * 900_000)[:10_000_000] + " needlefinal 尾部标记"
    tool = db.append_message("s", "tool", big, tool_name="dump")
    user = db.append_message("s", "user", big.replace("needle", "pin"))
    assert [m["content"] for m in db.get_messages("s")] == [big, big.replace("needle", "pin")]
    assert [h["id"] for h in db.search_messages("needlestart")] == [tool]
    assert db.search_messages("needlefinal") == []  # past the tool row's indexed prefix
    assert sorted(h["id"] for h in db.search_messages("尾部标记")) == [tool, user]
    assert [h["id"] for h in db.search_messages("pinfinal")] == [user]  # non-tool rows: all of it
    integrity(db)


def test_bad_session_fields_are_rejected_before_writing(db: SessionDB) -> None:
    # Typed (InvalidInputError) and still a TypeError, as for any unexpected keyword.
    with pytest.raises(TypeError, match="unknown session fields") as info:
        db.create_session("s", "cli", no_such_column=1)
    assert isinstance(info.value, InvalidInputError)
    assert db.get_session("s") is None
    db.create_session("s", "cli")
    # append_message has Hermes v23's exact signature: Python itself refuses the keyword.
    with pytest.raises(TypeError, match="bogus"):
        db.append_message("s", "user", "x", bogus=1)
    assert db.message_count() == 0


# bytes: valid UTF-8 is decoded (lossless), anything else is refused (codec docstring).
TEXT = "caf\u00e9 \u65e5\u672c\u8a9e bytesneedle"
RAW = TEXT.encode("utf-8")


def test_valid_bytes_are_stored_as_their_text(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", RAW, tool_name=b"web", tool_calls=b'[{"id": "c1"}]')
    db.append_messages([{"session_id": "s", "role": "assistant", "content": bytearray(RAW)}] * 2)
    db.append_messages([{"session_id": "s", "role": "tool", "content": RAW}] * 70)  # staged path
    msgs = db.get_messages("s")
    assert [m["content"] for m in msgs] == [TEXT] * 73
    assert msgs[0]["tool_name"] == "web" and msgs[0]["tool_calls"] == [{"id": "c1"}]
    assert db.get_session("s")["tool_call_count"] == 1
    db.replace_messages("s", [{"role": "user", "content": RAW}, {"role": "assistant", "content": memoryview(RAW)}])
    assert [m["content"] for m in db.get_messages("s")] == [TEXT, TEXT]
    assert db.search_messages("bytesneedle")[0]["session_id"] == "s"
    integrity(db)


@pytest.mark.parametrize("bad", [b"\xff\xfe", b"valid start \xc3", bytearray(b"\x80abc")])
def test_invalid_bytes_are_refused_and_nothing_changes(db: SessionDB, bad: bytes) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "kept")
    before = db.get_messages("s")
    with pytest.raises(InvalidInputError, match="not valid UTF-8"):
        db.append_message("s", "user", bad)
    with pytest.raises(InvalidInputError, match="message #1"):
        db.append_messages([{"session_id": "s", "role": "user", "content": "fine"},
                            {"session_id": "s", "role": "user", "content": bad}])
    with pytest.raises(InvalidInputError, match="message #0"):
        db.append_messages([{"session_id": "s", "role": "tool", "tool_name": bad}])
    with pytest.raises(InvalidInputError, match="message #2"):
        db.replace_messages("s", [{"role": "user", "content": "new"}] * 2 + [{"role": "user", "content": bad}])
    assert db.get_messages("s") == before
    assert db.get_session("s")["message_count"] == 1
    integrity(db)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    content=st.one_of(
        st.none(),
        st.text(),
        st.lists(st.dictionaries(st.sampled_from(["type", "text"]), st.text(max_size=20)), max_size=3),
    ),
    tool_calls=st.one_of(st.none(), st.text(max_size=30), st.lists(st.dictionaries(st.text(max_size=5), st.integers()), max_size=3)),
)
def test_any_message_is_stored_and_read_back(db: SessionDB, content, tool_calls) -> None:
    db.ensure_session("fuzz", "cli")
    before = db.message_count("fuzz")
    mid = db.append_message("fuzz", "user", content, tool_calls=tool_calls)
    assert db.message_count("fuzz") == before + 1
    stored = next(m for m in db.get_messages("fuzz") if m["id"] == mid)
    if isinstance(content, str):
        assert stored["content"] == content.encode("utf-8", "surrogatepass").decode("utf-8", "replace") or "\ufffd" in stored["content"]
    elif content is None:
        assert stored["content"] is None
    else:
        assert stored["content"] == content
