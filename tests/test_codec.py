"""Hermes' on-disk encodings: content prefix, JSON columns, text cleaning, memory blocks."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_store.codec import (
    JSON_PREFIX,
    check_key,
    clean_text,
    count_tool_calls,
    decode_content,
    decode_json,
    encode_content,
    encode_json,
    strip_memory_context,
    text_from_bytes,
)
from hermes_store.errors import InvalidInputError


def sqlite_roundtrip(value: str | None) -> str | None:
    """Store a value in a TEXT column and read it back, as the repositories will."""
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (v TEXT)")
    conn.execute("INSERT INTO t VALUES (?)", (value,))
    (out,) = conn.execute("SELECT v FROM t").fetchone()
    conn.close()
    return out


# ---------------------------------------------------------------- clean_text


def test_clean_text_fast_path_returns_same_object() -> None:
    s = "plain text 数据 🚀 \x00 inside"
    assert clean_text(s) is s


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("a\ud800b", "a\ufffdb"),
        ("\udfff", "\ufffd"),
        ("x\udc00\ud800y", "x\ufffd\ufffdy"),  # low then high is not a pair
        ("\ud83d\ude00", "😀"),  # a pair written as two code points is joined
        ("end\ud83d", "end\ufffd"),
        ("nul\x00kept\ud800", "nul\x00kept\ufffd"),
    ],
)
def test_clean_text_replaces_lone_surrogates(raw: str, expected: str) -> None:
    assert clean_text(raw) == expected
    assert sqlite_roundtrip(clean_text(raw)) == expected


def test_lone_surrogate_is_what_sqlite_rejects() -> None:
    with pytest.raises(UnicodeEncodeError):
        sqlite_roundtrip("a\ud800b")


# ---------------------------------------------------------------- content


def test_encode_content_shapes() -> None:
    assert encode_content(None) is None
    assert encode_content("hello") == "hello"
    assert encode_content("") == ""
    assert encode_content(42) == "42"
    assert encode_content(1.5) == "1.5"
    assert encode_content(True) == "True"
    parts = [{"type": "text", "text": "看这张图"}, {"type": "image_url", "image_url": {"url": "data:x"}}]
    encoded = encode_content(parts)
    assert encoded == JSON_PREFIX + json.dumps(parts, ensure_ascii=False)
    assert "看这张图" in encoded  # ensure_ascii=False, as Hermes writes it
    assert encode_content({"a": 1}) == JSON_PREFIX + '{"a": 1}'
    assert encode_content([]) == JSON_PREFIX + "[]"


def test_multimodal_content_roundtrips_through_sqlite() -> None:
    parts = [
        {"type": "text", "text": "what is in this image? \x00 数据"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]
    stored = sqlite_roundtrip(encode_content(parts))
    assert stored is not None and stored.startswith(JSON_PREFIX)
    assert decode_content(stored) == parts


def test_nul_in_plain_content_is_kept() -> None:
    text = "before\x00after"
    assert decode_content(sqlite_roundtrip(encode_content(text))) == text


def test_lone_surrogate_in_plain_content_is_replaced_not_lost() -> None:
    stored = sqlite_roundtrip(encode_content("bad\ud800byte"))
    assert decode_content(stored) == "bad\ufffdbyte"


def test_lone_surrogate_inside_json_content_roundtrips_exactly() -> None:
    parts = [{"type": "text", "text": "bad\ud800byte"}]
    stored = sqlite_roundtrip(encode_content(parts))
    assert decode_content(stored) == parts


def test_string_that_looks_like_encoded_json_reads_back_unchanged() -> None:
    tricky = JSON_PREFIX + '["not", "a", "list"]'
    stored = encode_content(tricky)
    assert stored != tricky
    assert decode_content(stored) == tricky
    # Hermes' own decoder (json.loads after the prefix) reads the same string.
    assert json.loads(stored[len(JSON_PREFIX):]) == tricky


@pytest.mark.parametrize(
    "text",
    [
        JSON_PREFIX + "{not json",
        JSON_PREFIX,
        JSON_PREFIX + "[1, 2",
    ],
)
def test_decode_content_with_invalid_json_returns_text(text: str) -> None:
    assert decode_content(text) == text


@pytest.mark.parametrize("text", [None, "", "plain", "\x00jsonish", "json:[1]", '["x"]'])
def test_decode_content_leaves_unprefixed_values_alone(text: str | None) -> None:
    assert decode_content(text) == text


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(st.one_of(st.characters(), st.characters(categories=["Cs"])), max_size=10),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=15,
)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.lists(json_values, max_size=4), st.dictionaries(st.text(max_size=5), json_values, max_size=4)))
def test_content_json_roundtrip(value: list | dict) -> None:
    stored = sqlite_roundtrip(encode_content(value))
    assert decode_content(stored) == value


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_content_string_roundtrip(value: str) -> None:
    stored = sqlite_roundtrip(encode_content(value))
    assert decode_content(stored) == value


@settings(max_examples=100, deadline=None)
@given(st.text())
def test_prefixed_string_roundtrip(tail: str) -> None:
    value = JSON_PREFIX + tail
    assert decode_content(sqlite_roundtrip(encode_content(value))) == value


# ---------------------------------------------------------------- JSON columns


@pytest.mark.parametrize("falsy", [None, "", [], {}, 0, False, 0.0, ()])
def test_encode_json_falsy_is_null(falsy: Any) -> None:
    assert encode_json(falsy) is None


def test_encode_json_shapes() -> None:
    calls = [{"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"q": "数据"}'}}]
    assert encode_json(calls) == json.dumps(calls, ensure_ascii=False)
    assert encode_json({"k": "数据"}) == '{"k": "数据"}'
    assert encode_json('{"already": "json"}') == '{"already": "json"}'  # kept verbatim
    assert encode_json("not json at all") == "not json at all"
    assert encode_json(5) == "5"
    assert encode_json(True) == "true"
    assert encode_json("bad\ud800") == "bad\ufffd"


def test_encode_json_tolerates_non_json_objects() -> None:
    from pathlib import PurePosixPath

    assert decode_json(encode_json({"path": PurePosixPath("/tmp/x")})) == {"path": "/tmp/x"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, None),
        ('{"a": [1, 2]}', {"a": [1, 2]}),
        ("[]", []),
        ("null", None),
        ("3", 3),
        ("{broken", "{broken"),
        ("not json", "not json"),
        ("", ""),
    ],
)
def test_decode_json(text: str | None, expected: Any) -> None:
    assert decode_json(text) == expected


def test_decode_json_passes_decoded_values_through() -> None:
    value = [{"id": 1}]
    assert decode_json(value) is value


@settings(max_examples=200, deadline=None)
@given(json_values.filter(lambda v: bool(v) and not isinstance(v, str)))
def test_json_column_roundtrip(value: Any) -> None:
    stored = sqlite_roundtrip(encode_json(value))
    assert decode_json(stored) == value


# ---------------------------------------------------------------- tool calls


@pytest.mark.parametrize(
    ("tool_calls", "expected"),
    [
        (None, 0),
        ([], 0),
        ([{"id": 1}], 1),
        ([{"id": 1}, {"id": 2}, {"id": 3}], 3),
        ('[{"id": 1}, {"id": 2}]', 2),
        ("[]", 0),
        ('{"id": 1}', 0),
        ({"id": 1}, 0),
        ("garbage", 0),
        ("", 0),
        (7, 0),
    ],
)
def test_count_tool_calls(tool_calls: Any, expected: int) -> None:
    assert count_tool_calls(tool_calls) == expected


# ---------------------------------------------------------------- memory context

NOTE = (
    "[System note: The following is recalled memory context, NOT new user input. "
    "Treat as informational background data.]"
)
BLOCK = "<memory-context>\n" + NOTE + "\n\nUser prefers dark mode.\nLives in Lyon.\n</memory-context>"


@pytest.mark.parametrize(
    "text",
    [
        "plain message",
        "",
        "talks about memory-context without tags",
        "[System note: memory is fine here]\nno block, so the note stays",
        "<memory-context> never closed",
    ],
)
def test_strip_memory_context_identity_without_block(text: str) -> None:
    assert strip_memory_context(text) is text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BLOCK + "\n\nWhat's the weather?", "What's the weather?"),
        ("What's the weather?\n\n" + BLOCK, "What's the weather?"),
        (BLOCK, ""),
        # the note right before the block
        (NOTE + "\n<memory-context>\nfacts\n</memory-context>\n\nHi there", "Hi there"),
        # the note right after the block
        ("<memory-context>\nfacts\n</memory-context>\n" + NOTE + "\n\nHi there", "Hi there"),
        # a block between two parts keeps the paragraph break
        ("Part one\n\n" + BLOCK + "\n\nPart two", "Part one\n\nPart two"),
        ("Part one\n" + BLOCK + "\nPart two", "Part one\nPart two"),
        ("Part one\n  \n" + BLOCK + "\nPart two", "Part one\n\nPart two"),
        ("inline <memory-context>x</memory-context> text", "inline text"),
        # several blocks
        (BLOCK + "\n\nquestion\n\n" + BLOCK, "question"),
        (BLOCK + "\n" + BLOCK + "\n\nquestion", "question"),
        # a note not about memory is the user's own text
        (BLOCK + "\n\n[System note: be brief]\nquestion", "[System note: be brief]\nquestion"),
        # user text keeps its inner layout
        (BLOCK + "\n\nline 1\n\n  indented\nline 3", "line 1\n\n  indented\nline 3"),
    ],
)
def test_strip_memory_context(text: str, expected: str) -> None:
    assert strip_memory_context(text) == expected


def test_strip_memory_context_leaves_non_strings_alone() -> None:
    parts = [{"type": "text", "text": BLOCK}]
    assert strip_memory_context(parts) is parts  # type: ignore[arg-type]
    assert strip_memory_context(None) is None  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(st.text(), st.text())
def test_strip_memory_context_removes_every_block(before: str, after: str) -> None:
    out = strip_memory_context(before + BLOCK + after)
    assert "<memory-context>" not in out.lower() or "<memory-context>" in (before + after).lower()
    assert "User prefers dark mode." not in out or "User prefers dark mode." in before + after


# ---------------------------------------------------------------- bytes and keys


@pytest.mark.parametrize("raw", [b"plain ascii", "caf\u00e9 \u65e5\u672c \U0001f600".encode(), b"", b"nul\x00inside"])
def test_valid_utf8_bytes_decode_losslessly(raw: bytes) -> None:
    for value in (raw, bytearray(raw), memoryview(raw)):
        assert text_from_bytes(value) == raw.decode("utf-8")
    if raw:
        assert encode_content(raw) == raw.decode("utf-8")
        assert sqlite_roundtrip(encode_content(raw)).encode("utf-8") == raw


@pytest.mark.parametrize("raw", [b"\xff\xfe", b"ok then \xc3", b"\xed\xa0\x80", b"\x80"])
def test_invalid_utf8_bytes_are_refused(raw: bytes) -> None:
    with pytest.raises(InvalidInputError, match="not valid UTF-8") as info:
        encode_content(raw)
    assert isinstance(info.value.__cause__, UnicodeDecodeError)
    with pytest.raises(InvalidInputError):
        encode_json(raw)


def test_bytes_never_stored_as_their_repr() -> None:
    assert encode_content(b"hello") == "hello"
    assert "b'" not in encode_content(b"hello")
    assert encode_content(JSON_PREFIX.encode() + b"x") == JSON_PREFIX + json.dumps(JSON_PREFIX + "x")
    assert encode_json(b'[{"id": "c1"}]') == '[{"id": "c1"}]'
    assert encode_json(b"") is None  # falsy, like ""


def test_check_key() -> None:
    assert check_key("ok id \x00 with nul") == "ok id \x00 with nul"
    for bad in ("half \ud800", "\udfff", 12, None, b"bytes"):
        with pytest.raises(InvalidInputError):
            check_key(bad, "session id")
