"""Title sanitizing and "base #N" lineage numbering."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import event
from sqlalchemy.exc import IntegrityError

from hermes_store import SessionDB
from hermes_store.errors import HermesStoreError, InvalidTitleError, TitleConflictError
from hermes_store.titles import MAX_TITLE_LENGTH, sanitize_title, split_title_number

pytestmark = pytest.mark.both_backends

INVISIBLE = (
    [chr(c) for c in range(0x00, 0x20) if chr(c) not in "\t\n\r"]
    + ["\x7f"]
    + [chr(c) for c in range(0x200B, 0x2010)]
    + [chr(c) for c in range(0x2028, 0x202F)]
    + [chr(c) for c in range(0x2060, 0x206A)]
    + ["\ufeff"]
    + [chr(c) for c in range(0xFFF9, 0xFFFD)]
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        ("", None),
        ("   ", None),
        ("\t\n\r", None),
        ("\u200b\u200b", None),
        ("\x00\x07\x1b", None),
        ("My session", "My session"),
        ("  padded  ", "padded"),
        ("many    spaces", "many spaces"),
        ("a\tb", "a b"),
        ("a\nb\r\nc", "a b c"),
        ("a\x00b\x07c\x7fd", "abcd"),  # control characters are dropped, not spaced
        ("ansi \x1b[31mred\x1b[0m", "ansi [31mred[0m"),
        ("he\u200bllo", "hello"),  # zero-width space
        ("zw\u200cnj\u200dj", "zwnjj"),
        ("\u202eevil.exe", "evil.exe"),  # right-to-left override
        ("\u2066isolated\u2069", "isolated"),
        ("\ufeffBOM", "BOM"),
        ("obj\ufffcect", "object"),
        ("line\u2028sep", "linesep"),
        ("a \u200b b", "a b"),  # removal can leave a run of spaces: collapsed
        ("a\u00a0\u00a0b", "a b"),  # Unicode whitespace collapses too
        ("数据库 迁移 🚀", "数据库 迁移 🚀"),
        ("x #2", "x #2"),
        ("100% done_ok", "100% done_ok"),
        ("bad\ud800", "bad\ufffd"),  # lone surrogate: storable replacement
    ],
)
def test_sanitize_title(raw: str | None, expected: str | None) -> None:
    assert sanitize_title(raw) == expected


@pytest.mark.parametrize("ch", INVISIBLE)
def test_every_listed_invisible_character_is_removed(ch: str) -> None:
    assert sanitize_title(f"a{ch}b") == "ab"


@pytest.mark.parametrize("ch", ["\u200a", "\u2010", "\u2027", "\u202f", "\u205f", "\u206a", "\ufff8", "\ufffd"])
def test_neighbours_of_the_ranges_are_not_removed(ch: str) -> None:
    out = sanitize_title(f"a{ch}b")
    assert out is not None and len(out) == 3


def test_length_limit() -> None:
    assert MAX_TITLE_LENGTH == 100
    assert sanitize_title("x" * 100) == "x" * 100
    with pytest.raises(InvalidTitleError, match="too long"):
        sanitize_title("x" * 101)


def test_length_is_counted_after_cleaning() -> None:
    assert sanitize_title("\u200b" * 50 + "x" * 100 + "   ") == "x" * 100
    assert sanitize_title("a" + " " * 200 + "b") == "a b"
    assert sanitize_title("数" * 100) == "数" * 100  # characters, not bytes


def test_invalid_title_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        sanitize_title("y" * 150)
    with pytest.raises(HermesStoreError):
        sanitize_title("y" * 150)


def test_non_string_title_is_rejected_clearly() -> None:
    with pytest.raises(InvalidTitleError, match="string"):
        sanitize_title(42)  # type: ignore[arg-type]


title_text = st.text(
    st.one_of(
        st.characters(),
        st.sampled_from([*INVISIBLE, "\t", "\n", "\r", " ", "\xa0", "\u3000"]),
        st.characters(categories=["Cs"]),
    ),
    max_size=140,
)
_FORBIDDEN = re.compile(
    "[\x00-\x1f\x7f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ufff9-\ufffc\ud800-\udfff]"
)


@settings(max_examples=400, deadline=None)
@given(title_text)
def test_sanitize_title_properties(raw: str) -> None:
    try:
        out = sanitize_title(raw)
    except InvalidTitleError:
        return
    if out is None:
        return
    assert sanitize_title(out) == out  # idempotent
    assert 0 < len(out) <= MAX_TITLE_LENGTH
    assert out == out.strip()
    assert not re.search(r"\s\s", out)
    assert not _FORBIDDEN.search(out)
    out.encode("utf-8")


@settings(max_examples=200, deadline=None)
@given(title_text)
def test_too_long_is_the_only_error(raw: str) -> None:
    try:
        sanitize_title(raw)
    except InvalidTitleError as exc:
        assert "too long" in str(exc)


# ---------------------------------------------------------------- numbering


@pytest.mark.parametrize(
    ("title", "expected"),
    [
        ("x #3", ("x", 3)),
        ("my session #12", ("my session", 12)),
        ("x", ("x", None)),
        ("x #0", ("x #0", None)),
        ("x #abc", ("x #abc", None)),
        ("x #-1", ("x #-1", None)),
        ("x #007", ("x #007", None)),
        ("x#3", ("x#3", None)),
        ("#3", ("#3", None)),
        ("x #3 ", ("x #3 ", None)),
        ("x #٣", ("x #٣", None)),  # Arabic-Indic digit: not a lineage number
        ("x #2 #5", ("x #2", 5)),
        ("数据 #2", ("数据", 2)),
    ],
)
def test_split_title_number(title: str, expected: tuple[str, int | None]) -> None:
    assert split_title_number(title) == expected


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=40), st.integers(min_value=1, max_value=10**6))
def test_split_inverts_numbering(base: str, n: int) -> None:
    assert split_title_number(f"{base} #{n}") == (base, n)


# ---------------------------------------------------------------- concurrent titles


# Two stores racing for one title, on both backends: tests/compat/test_titles.py.


def test_a_writer_slipping_in_between_check_and_update_is_a_conflict(db: SessionDB) -> None:
    """The UNIQUE index is the last word: if another writer takes the title after the
    check (a connection without BEGIN IMMEDIATE could), the update fails as a
    TitleConflictError chained to the IntegrityError, and nothing is written."""
    db.create_session("a", "cli")
    db.create_session("b", "cli")
    fired: list[str] = []

    def slip_in(conn, cursor, statement, parameters, context, executemany):
        if statement.startswith("UPDATE sessions SET title") and not fired:
            fired.append(statement)
            cursor.execute("UPDATE sessions SET title = 'contested' WHERE id = 'b'")

    event.listen(db.engine, "before_cursor_execute", slip_in)
    try:
        with pytest.raises(TitleConflictError, match="already in use") as info:
            db.set_session_title("a", "contested")
    finally:
        event.remove(db.engine, "before_cursor_execute", slip_in)
    assert fired
    assert isinstance(info.value.__cause__, IntegrityError)
    assert db.get_session_title("a") is None
    assert db.get_session_title("b") is None  # the whole transaction rolled back
    assert db.set_session_title("a", "contested") is True  # and the title is free again
