"""Hermes v23 titles through the swapped ``hermes_state`` (reference §1.I).

sanitize_title with surrogate scrubbing, set_session_title with the title moving over
from a compression ancestor, and set_auto_title_if_empty.
"""

from __future__ import annotations

import itertools
import threading

import pytest

from hermes_store.errors import TitleConflictError

pytestmark = pytest.mark.both_backends


def chain(db, *ids: str, reasons: tuple[str, ...] | None = None) -> None:
    """Sessions ids[0] → ids[1] → …, each parent ended with 'compression' (or ``reasons``)."""
    reasons = reasons or ("compression",) * (len(ids) - 1)
    db.create_session(ids[0], "cli")
    for (parent, child), reason in zip(itertools.pairwise(ids), reasons, strict=True):
        db.end_session(parent, reason)
        db.create_session(child, "cli", parent_session_id=parent)


def titles(db, *ids: str) -> list[str | None]:
    return [db.get_session_title(i) for i in ids]


# ---------------------------------------------------------------------- sanitize_title


def test_sanitize_title_is_a_static_method_of_the_class(hermes_state, db) -> None:
    assert hermes_state.SessionDB.sanitize_title("  a \u200b b ") == "a b"
    assert db.sanitize_title("x") == "x"


@pytest.mark.parametrize(("raw", "expected"), [
    (None, None),
    ("", None),
    ("  \t\n ", None),
    ("\u200b\ufeff", None),
    ("a\x00b\x07c", "abc"),
    ("a\tb\nc", "a b c"),
    ("\u202eevil", "evil"),
    ("bad\ud800half", "bad\ufffdhalf"),  # a lone surrogate is scrubbed, not an error
    ("\udc80", "\ufffd"),
    ("pair \ud83d\ude80", "pair \U0001f680"),  # a surrogate pair written as two code points: joined
])
def test_sanitize_title_rules(hermes_state, raw, expected) -> None:
    assert hermes_state.SessionDB.sanitize_title(raw) == expected


def test_sanitize_title_length_error_is_hermes_value_error(hermes_state) -> None:
    sanitize = hermes_state.SessionDB.sanitize_title
    assert sanitize("x" * 100) == "x" * 100
    with pytest.raises(ValueError) as info:
        sanitize("x" * 101)
    assert str(info.value) == "Title too long (101 chars, max 100)"
    assert sanitize("\u200b" * 20 + "y" * 100) == "y" * 100  # counted after cleaning


def test_a_scrubbed_title_is_stored_and_found(db) -> None:
    db.create_session("s", "cli")
    assert db.set_session_title("s", "half \ud800 title") is True
    assert db.get_session_title("s") == "half \ufffd title"
    assert db.get_session_by_title("half \ufffd title")["id"] == "s"


# ---------------------------------------------------------------------- set_session_title


def test_set_session_title_returns_whether_a_row_changed(db) -> None:
    db.create_session("s", "cli")
    assert db.set_session_title("s", "  My  plan ") is True
    assert db.get_session_title("s") == "My plan"
    assert db.set_session_title("s", "My plan") is True  # its own title again
    assert db.set_session_title("ghost", "anything") is False
    assert db.get_session("ghost") is None


def test_a_title_that_cleans_to_nothing_clears_it(db) -> None:
    db.create_session("s", "cli")
    db.set_session_title("s", "t")
    assert db.set_session_title("s", "  \u200b ") is True
    assert db.get_session_title("s") is None


def test_a_title_held_by_another_session_is_a_value_error(db) -> None:
    db.create_session("a", "cli")
    db.create_session("b", "cli")
    db.set_session_title("a", "shared")
    with pytest.raises(ValueError) as info:
        db.set_session_title("b", "  shared ")
    assert str(info.value) == "Title 'shared' is already in use by session a"
    assert titles(db, "a", "b") == ["shared", None]


def test_conflict_is_raised_even_for_an_unknown_session(db) -> None:
    db.create_session("a", "cli")
    db.set_session_title("a", "taken")
    with pytest.raises(ValueError, match="already in use by session a"):
        db.set_session_title("ghost", "taken")


def test_the_title_moves_from_the_compressed_parent(db) -> None:
    chain(db, "root", "tip")
    db.set_session_title("root", "Project")
    assert db.set_session_title("tip", "Project") is True
    assert titles(db, "root", "tip") == [None, "Project"]
    assert db.get_session_by_title("Project")["id"] == "tip"


def test_the_title_moves_from_any_compression_ancestor(db) -> None:
    chain(db, "a", "b", "c", "d")
    db.set_session_title("a", "Long job")
    db.set_session_title("b", "middle")
    assert db.set_session_title("d", "Long job") is True
    assert titles(db, "a", "b", "c", "d") == [None, "middle", None, "Long job"]


@pytest.mark.parametrize("reason", ["branched", "user_exit", None])
def test_no_transfer_from_a_parent_that_did_not_end_with_compression(db, reason) -> None:
    db.create_session("p", "cli")
    if reason:
        db.end_session("p", reason)
    db.create_session("c", "cli", parent_session_id="p")
    db.set_session_title("p", "mine")
    with pytest.raises(ValueError, match="already in use by session p"):
        db.set_session_title("c", "mine")
    assert titles(db, "p", "c") == ["mine", None]


def test_the_walk_stops_at_a_parent_that_did_not_end_with_compression(db) -> None:
    chain(db, "a", "b", "c", reasons=("compression", "user_exit"))
    db.set_session_title("a", "far")
    with pytest.raises(ValueError, match="session a"):
        db.set_session_title("c", "far")
    assert db.set_session_title("b", "far") is True  # b is a's direct continuation
    assert titles(db, "a", "b") == [None, "far"]


def test_no_transfer_from_a_descendant_or_a_sibling(db) -> None:
    chain(db, "root", "tip")
    db.create_session("sibling", "cli", parent_session_id="root")
    db.set_session_title("tip", "newest")
    with pytest.raises(ValueError, match="session tip"):
        db.set_session_title("root", "newest")
    with pytest.raises(ValueError, match="session tip"):
        db.set_session_title("sibling", "newest")
    assert titles(db, "root", "tip", "sibling") == [None, "newest", None]


def test_a_parent_cycle_does_not_hang_the_walk(db) -> None:
    db.create_session("x", "cli")
    db.create_session("y", "cli", parent_session_id="x")
    db.update_session("x", parent_session_id="y")
    db.end_session("x", "compression")
    db.end_session("y", "compression")
    db.create_session("other", "cli")
    db.set_session_title("other", "free?")
    with pytest.raises(ValueError, match="session other"):
        db.set_session_title("x", "free?")
    db.set_session_title("y", "cycled")
    assert db.set_session_title("x", "cycled") is True  # y is x's compressed parent
    assert titles(db, "x", "y") == ["cycled", None]


def test_an_automatic_title_never_takes_over_a_user_title_even_by_transfer(db) -> None:
    chain(db, "root", "tip")
    db.set_session_title("tip", "typed by the user")
    db.set_session_title("root", "summary")
    assert db.set_session_title("tip", "summary", title_source="llm") is False
    assert titles(db, "root", "tip") == ["summary", "typed by the user"]


def test_title_source_is_recorded_and_moves_with_the_title(db) -> None:
    chain(db, "root", "tip")
    db.set_session_title("root", "auto", title_source="llm")
    assert db.set_session_title("tip", "auto", title_source="llm") is True
    assert db.get_session("root")["title_source"] is None
    assert (db.get_session("tip")["title"], db.get_session("tip")["title_source"]) == ("auto", "llm")


def test_racing_writers_for_one_title_exactly_one_wins(hermes_state, db) -> None:
    second = hermes_state.SessionDB(db.db_path if db.db_path is not None else db.url)
    try:
        db.create_session("a", "cli")
        db.create_session("b", "cli")
        for n in range(8):
            title = f"contested {n}"
            barrier = threading.Barrier(2)
            outcome: dict[str, object] = {}

            def claim(store, sid: str, title=title, barrier=barrier, outcome=outcome) -> None:
                barrier.wait()
                try:
                    outcome[sid] = store.set_session_title(sid, title)
                except Exception as exc:
                    outcome[sid] = exc

            threads = [threading.Thread(target=claim, args=(db, "a")),
                       threading.Thread(target=claim, args=(second, "b"))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            winners = [sid for sid, result in outcome.items() if result is True]
            [loss] = [result for result in outcome.values() if result is not True]
            assert len(winners) == 1 and isinstance(loss, ValueError) and "already in use" in str(loss)
            assert isinstance(loss, TitleConflictError)
            assert db.get_session_by_title(title)["id"] == winners[0]
            assert db.get_session_title("b" if winners[0] == "a" else "a") != title
    finally:
        second.close()


# ---------------------------------------------------------------------- set_auto_title_if_empty


def test_auto_title_is_written_only_while_untitled(db) -> None:
    db.create_session("s", "cli")
    assert db.set_auto_title_if_empty("s", "  Generated   title ") is True
    assert db.get_session_title("s") == "Generated title"
    assert db.get_session("s")["title_source"] == "llm"
    assert db.set_auto_title_if_empty("s", "Another") is False
    assert db.get_session_title("s") == "Generated title"


def test_auto_title_of_a_missing_session_is_false(db) -> None:
    assert db.set_auto_title_if_empty("ghost", "t") is False
    assert db.get_session("ghost") is None


def test_auto_title_that_cleans_to_nothing(db) -> None:
    db.create_session("s", "cli")
    assert db.set_auto_title_if_empty("s", " \u200b\t") is True
    assert db.get_session_title("s") is None
    assert db.set_auto_title_if_empty("s", None) is True
    db.set_session_title("s", "kept")
    assert db.set_auto_title_if_empty("s", "") is False
    assert db.get_session_title("s") == "kept"


def test_auto_title_conflict_and_length_rules(db) -> None:
    db.create_session("a", "cli")
    db.create_session("b", "cli")
    db.set_session_title("a", "taken")
    with pytest.raises(ValueError) as info:
        db.set_auto_title_if_empty("b", "taken")
    assert str(info.value) == "Title 'taken' is already in use by session a"
    with pytest.raises(ValueError, match=r"^Title too long \(150 chars, max 100\)$"):
        db.set_auto_title_if_empty("b", "z" * 150)
    assert titles(db, "a", "b") == ["taken", None]


def test_auto_title_moves_from_a_compression_ancestor(db) -> None:
    chain(db, "root", "mid", "tip")
    db.set_session_title("root", "Carried over")
    assert db.set_auto_title_if_empty("tip", "Carried over") is True
    assert titles(db, "root", "mid", "tip") == [None, None, "Carried over"]


def test_auto_title_on_a_titled_continuation_leaves_the_ancestor_alone(db) -> None:
    chain(db, "root", "tip")
    db.set_session_title("root", "Old")
    db.set_session_title("tip", "Current")
    assert db.set_auto_title_if_empty("tip", "Old") is False
    assert titles(db, "root", "tip") == ["Old", "Current"]


def test_racing_auto_titles_write_once(hermes_state, db) -> None:
    second = hermes_state.SessionDB(db.db_path if db.db_path is not None else db.url)
    try:
        for n in range(8):
            sid = f"s{n}"
            db.create_session(sid, "cli")
            barrier = threading.Barrier(2)
            outcome: dict[str, bool] = {}

            def generate(store, title: str, sid=sid, barrier=barrier, outcome=outcome) -> None:
                barrier.wait()
                outcome[title] = store.set_auto_title_if_empty(sid, title)

            threads = [threading.Thread(target=generate, args=(db, f"first {n}")),
                       threading.Thread(target=generate, args=(second, f"second {n}"))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            [winner] = [t for t, ok in outcome.items() if ok]
            assert sorted(outcome.values()) == [False, True]
            assert db.get_session_title(sid) == winner
    finally:
        second.close()
