"""Hermes v26 ``search_messages`` (reference §2.F, §5.3) through the swapped ``hermes_state``.

The ``fields`` projection, the LIKE scan while the search index is stale (the
``fts_stale`` key or the store's own flag; SQLite's FTS5 only, PostgreSQL's index is
kept by the database and never goes stale) and the slow-search log.
"""

from __future__ import annotations

import logging

import pytest

pytestmark = pytest.mark.both_backends

ALL_KEYS = {"id", "session_id", "role", "snippet", "timestamp", "tool_name", "source", "model", "session_started",
            "context"}


@pytest.fixture
def corpus(db):
    db.create_session("s", "cli", model="m1")
    db.append_message("s", "user", "please deploy the build", timestamp=100.0)
    db.append_message("s", "assistant", "deploying now", timestamp=101.0)
    db.append_message("s", "user", "the redeployment finished " + "x" * 200, timestamp=102.0)
    db.append_message("s", "assistant", "deploy failed on staging", timestamp=103.0)
    return db


# ---------------------------------------------------------------------- fields


def test_fields_project_the_hits_without_changing_them(corpus) -> None:
    full = corpus.search_messages("deploy")
    assert full and all(set(h) == ALL_KEYS for h in full)
    slim = corpus.search_messages("deploy", fields=["snippet", "id"])
    assert slim == [{"id": h["id"], "snippet": h["snippet"]} for h in full]
    assert list(slim[0]) == ["id", "snippet"]  # Hermes' key order, not the caller's
    with_context = corpus.search_messages("deploy", fields={"id", "context"})
    assert with_context == [{"id": h["id"], "context": h["context"]} for h in full]
    assert corpus.search_messages("deploy", fields=()) == [{} for _ in full]


def test_fields_are_checked(corpus) -> None:
    with pytest.raises(TypeError):
        corpus.search_messages("deploy", fields="id")
    with pytest.raises(ValueError, match="nope"):
        corpus.search_messages("deploy", fields=["id", "nope"])
    with pytest.raises(ValueError):
        corpus.search_messages("", fields=["nope"])  # checked before the query


# ---------------------------------------------------------------------- slow log


def test_slow_log_threshold(corpus, monkeypatch, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="hermes_state")
    monkeypatch.delenv("HERMES_SEARCH_SLOW_MS", raising=False)
    corpus.search_messages("deploy")
    assert not [r for r in caplog.records if r.name == "hermes_state"]
    monkeypatch.setenv("HERMES_SEARCH_SLOW_MS", "0")
    corpus.search_messages("deploy")
    logged = [r for r in caplog.records if r.name == "hermes_state"]
    assert len(logged) == 1 and "search_messages" in logged[0].getMessage()
    monkeypatch.setenv("HERMES_SEARCH_SLOW_MS", "not a number")
    corpus.search_messages("deploy")
    assert len([r for r in caplog.records if r.name == "hermes_state"]) == 1


# ---------------------------------------------------------------------- stale index (FTS5)


def ids_of(hits) -> list[int]:
    return [h["id"] for h in hits]


@pytest.mark.sqlite_only
def test_a_stale_index_key_turns_search_into_a_like_scan(hermes_state, corpus, tmp_path) -> None:
    before = corpus.search_messages("deploy")
    assert all("redeployment" not in h["snippet"] for h in before)  # a word search
    other = hermes_state.SessionDB(tmp_path / "state.db")  # opened before the key is set
    try:
        corpus.set_meta("fts_stale", "1")
        for store in (corpus, other):
            hits = store.search_messages("deploy")
            timestamps = [h["timestamp"] for h in hits]
            assert timestamps == [103.0, 102.0, 101.0, 100.0]  # newest first, substrings too
            redeploy = hits[1]
            assert redeploy["snippet"] == ("the redeployment finished " + "x" * 200)[:120]
            assert ">>>" not in redeploy["snippet"] and redeploy["context"]
            assert ids_of(store.search_messages("staging OR build")) == [hits[0]["id"], hits[3]["id"]]
            assert ids_of(store.search_messages("deploy NOT staging")) == ids_of(hits[1:])
        corpus.set_meta("fts_stale", "0")
        assert ids_of(corpus.search_messages("deploy")) == ids_of(before)
    finally:
        other.close()


@pytest.mark.sqlite_only
def test_the_stores_own_stale_flag_turns_search_into_a_like_scan(corpus) -> None:
    word = corpus.search_messages("deploy")
    corpus._fts_stale = True
    try:
        scanned = corpus.search_messages("deploy")
        assert len(word) == 2 and [h["timestamp"] for h in scanned] == [103.0, 102.0, 101.0, 100.0]
    finally:
        corpus._fts_stale = False


def test_postgresql_ignores_the_key_its_index_cannot_go_stale(corpus, backend) -> None:
    word = corpus.search_messages("deploy")
    corpus.set_meta("fts_stale", "1")
    if backend == "postgresql":
        assert corpus.search_messages("deploy") == word
    else:
        assert len(word) == 2 and len(corpus.search_messages("deploy")) == 4
