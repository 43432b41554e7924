"""Reads reshaped for PostgreSQL's planner (issue 32 part 3), with the answers they had.

* Listing filters spell out "NULL or 0" (``hidden``, ``archived``) and ``pinned != 0``
  instead of ``coalesce(x, 0)`` (the head schema holds no NULL there; an older file
  may): 0 and 1 still fall where they fell.
* The compression tip and ``get_session_lineage`` walk the forward subgraph in one
  recursive statement that carries the node columns, and read the latest activity only
  for a member with a sibling: a choice between continuations deep in a chain is still
  made by it.
* A word query whose terms sit inside CJK runs is looked up with its trigram patterns
  unknown to the planner and its run rule tested on content read once: every term is
  still required, word hits still rank first, and a page past the hits still finds the
  run rows.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import update

from hermes_store import SessionDB
from hermes_store.models import Base

pytestmark = pytest.mark.both_backends

SESSIONS = Base.metadata.tables["sessions"]


def _set(db: SessionDB, sid: str, **values: Any) -> None:
    with db.engine.begin() as conn:
        assert conn.execute(update(SESSIONS).where(SESSIONS.c.id == sid).values(**values)).rowcount == 1


def _ids(rows: list[dict[str, Any]]) -> set[str]:
    return {r["id"] for r in rows}


def test_listing_reads_zero_and_one_as_before(db: SessionDB) -> None:
    for i, (hidden, archived, pinned) in enumerate(
        [(0, 0, 0), (0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 1)]
    ):
        sid = f"s{i}"
        db.create_session(sid, "cli")
        db.append_message(sid, "user", f"hello {i}")
        _set(db, sid, hidden=hidden, archived=archived, pinned=pinned)
    listed = _ids(db.list_sessions_rich(limit=50))
    assert listed == {"s0", "s1", "s4"}  # not hidden, not archived
    assert _ids(db.list_sessions_rich(limit=50, include_hidden=True)) == {"s0", "s1", "s2", "s4"}
    assert _ids(db.list_sessions_rich(limit=50, include_archived=True)) == {"s0", "s1", "s3", "s4"}
    assert _ids(db.list_sessions_rich(limit=50, archived_only=True)) == {"s3"}  # hidden s5 stays out
    assert _ids(db.list_sessions_rich(limit=50, archived_only=True, include_hidden=True)) == {"s3", "s5"}
    pinned = db.list_sessions_rich(limit=50, include_pinned=True)
    assert _ids(pinned) >= {"s0", "s1", "s4"} and not _ids(pinned) & {"s2", "s3", "s5"}


def _chain(db: SessionDB, n: int) -> list[str]:
    """``n`` sessions, each continuing the one before by compression, one message each."""
    ids = [f"c{i:03d}" for i in range(n)]
    for i, sid in enumerate(ids):
        db.create_session(sid, "cli", parent_session_id=ids[i - 1] if i else None)
        db.append_message(sid, "user", f"step {i}")
        _set(db, sid, started_at=100.0 + 10 * i)
        if i + 1 < n:
            _set(db, sid, ended_at=105.0 + 10 * i, end_reason="compression")
    return ids


def test_a_choice_deep_in_a_chain_still_goes_by_latest_activity(db: SessionDB) -> None:
    ids = _chain(db, 30)
    last = ids[-1]
    _set(db, last, ended_at=400.0, end_reason="compression")
    # Two continuations of the last member: the one started first holds the newer message.
    for sid, started in (("early", 410.0), ("late", 420.0)):
        db.create_session(sid, "cli", parent_session_id=last)
        _set(db, sid, started_at=started)
    db.append_message("late", "user", "older")
    db.append_message("early", "user", "newer")
    with db.engine.begin() as conn:  # message times as the test wants them, not the clock's
        messages = Base.metadata.tables["messages"]
        conn.execute(update(messages).where(messages.c.session_id == "late").values(timestamp=430.0))
        conn.execute(update(messages).where(messages.c.session_id == "early").values(timestamp=440.0))
    assert db.get_compression_tip(ids[0]) == "early"
    assert db.get_compression_tip(ids[10]) == "early"
    assert db.get_session_lineage(ids[5]) == [*ids, "early"]
    assert db.get_session_lineage("early") == [*ids, "early"]
    db.append_message("late", "user", "newest")
    with db.engine.begin() as conn:
        conn.execute(update(messages).where(messages.c.content == "newest").values(timestamp=450.0))
    assert db.get_compression_tip(ids[0]) == "late"


def test_a_plain_chain_tip_and_lineage(db: SessionDB) -> None:
    ids = _chain(db, 40)
    assert db.get_compression_tip(ids[0]) == ids[-1]
    assert db.get_compression_tip(ids[-1]) == ids[-1]
    assert db.get_session_lineage(ids[-1]) == ids
    assert db.get_session_lineage(ids[20]) == ids


def test_every_term_of_a_three_word_query_is_required_inside_cjk_runs(db: SessionDB) -> None:
    db.create_session("t", "cli")
    words = db.append_message("t", "user", "SQLite WAL checkpoint tuning notes")
    runs = db.append_message("t", "user", "今天讨论SQLite和WAL的checkpoint机制")
    db.append_message("t", "user", "讨论SQLite和WAL的事情")  # checkpoint missing
    db.append_message("t", "user", "SQLite and WAL without the third word")
    db.append_message("t", "user", "讨论checkpoint和SQLite")  # WAL missing
    hits = db.search_messages("sqlite wal checkpoint")
    assert [h["id"] for h in hits] == [words, runs]  # word hits rank first, run rows after
    assert ">>>checkpoint<<<" in hits[0]["snippet"]
    assert ">>>" in hits[1]["snippet"] and hits[1]["context"]
    assert [h["id"] for h in db.search_messages("sqlite wal checkpoint", limit=1, offset=1)] == [runs]
    assert db.search_messages("sqlite wal checkpoint", offset=2) == []
    assert [h["id"] for h in db.search_messages("sqlite wal checkpoint", sort="newest")] == [runs, words]
    assert [h["id"] for h in db.search_messages("wal checkpoint NOT tuning")] == [runs]
