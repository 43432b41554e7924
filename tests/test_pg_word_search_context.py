"""A hit's context (previous message, the hit, next message) when timestamps tie.

PostgreSQL reads each neighbour with one row comparison on ``(timestamp, id)`` joined
LATERAL to the page (``search_base.with_lateral_context``); SQLite keeps its
``timestamp <= … AND (timestamp < … OR id < …)`` form. Both must pick, within the hit's
session only, the greatest ``(timestamp, id)`` below the hit and the least above it. The
corpus makes that choice depend on the id: runs of equal timestamps, and a second
session whose rows sit between the first's, at the same timestamps. Every page form of
the word and substring routes is read: the plain word page (a phrase: no Latin-in-CJK
lookup), the word page with the lookup (fewer hits than the page, and a page full of
word hits), its lookup's own rows, the substring page, each by rank and by time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from hermes_store import SessionDB

from .helpers import module_store

#: (session, role, content, timestamp), inserted in this order (ids 1, 2, ...).
ROWS: list[tuple[str, str, str, float]] = [
    ("s1", "user", "alpha opening words", 10.0),
    ("s2", "user", "other session before", 20.0),
    ("s1", "assistant", "zebra one", 20.0),
    ("s1", "user", "zebra two 数据库", 20.0),
    ("s2", "assistant", "other session between 数据", 20.0),
    ("s1", "assistant", "zebra three", 20.0),
    ("s1", "user", "我们讨论quokka通信", 30.0),
    ("s2", "user", "other session after", 30.0),
    ("s1", "assistant", "omega 数据 again", 30.0),
    ("s1", "user", "closing words", 40.0),
] + [("s3", "user" if i % 2 else "assistant", f"filler common {i}", 100.0 + i // 3) for i in range(24)]
#: The first id of the filler session.
FILLER_FROM = 11


def build(db: SessionDB) -> SessionDB:
    for sid in ("s1", "s2", "s3"):
        db.create_session(sid, "cli")
    for sid, role, content, _ts in ROWS:
        db.append_message(sid, role, content)
    cases = " ".join(f"WHEN {i} THEN {ts}" for i, (_s, _r, _c, ts) in enumerate(ROWS, start=1))
    db._execute_write(lambda c: c.execute(f"UPDATE messages SET timestamp = CASE id {cases} END"))
    return db


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionDB]:
    with module_store(request, tmp_path_factory, build) as db:
        yield db


def expected_context(hit_id: int) -> list[tuple[str, str]]:
    """(role, content) of the previous message, the hit and the next one, from ROWS."""
    rows = [(ts, i, sid, role, content) for i, (sid, role, content, ts) in enumerate(ROWS, start=1)]
    ts, _i, sid, role, content = rows[hit_id - 1]
    same = sorted(r for r in rows if r[2] == sid)
    before = [r for r in same if (r[0], r[1]) < (ts, hit_id)]
    after = [r for r in same if (r[0], r[1]) > (ts, hit_id)]
    out = [(before[-1][3], before[-1][4])] if before else []
    out.append((role, content))
    if after:
        out.append((after[0][3], after[0][4]))
    return out


def contexts(hits: list[dict[str, Any]]) -> dict[int, list[tuple[str, str]]]:
    return {h["id"]: [(c["role"], c["content"]) for c in h["context"]] for h in hits}


@pytest.mark.parametrize("sort", [None, "newest", "oldest"])
@pytest.mark.parametrize(("query", "found"), [
    ('"zebra two"', {4}),  # a phrase: the plain word page
    ("zebra", {3, 4, 6}),  # fewer word hits than the page: the Latin-in-CJK lookup runs
    ("quokka", {7}),  # found by that lookup only (a Latin word glued to CJK text)
    ("数据", {4, 5, 9}),  # two CJK characters: the substring page
    ("数据库", {4}),  # three: the substring page over the trigram index
])
def test_context_follows_timestamp_then_id_within_the_session(store: SessionDB, query: str, found: set[int],
                                                              sort: str | None) -> None:
    hits = store.search_messages(query, sort=sort)
    assert {h["id"] for h in hits} == found
    assert contexts(hits) == {i: expected_context(i) for i in found}


@pytest.mark.parametrize("sort", [None, "newest", "oldest"])
def test_context_of_a_full_page_of_word_hits(store: SessionDB, sort: str | None) -> None:
    """24 rows hold "common", 3 per timestamp: a page of 20 from them, with the lookup
    guarded off by rank (the word hits fill the page) or read by time."""
    hits = store.search_messages("common", sort=sort)
    assert len(hits) == 20
    assert all(h["id"] >= FILLER_FROM for h in hits)
    assert contexts(hits) == {h["id"]: expected_context(h["id"]) for h in hits}
    if sort == "oldest":
        assert hits[0]["id"] == FILLER_FROM and len(hits[0]["context"]) == 2  # nothing before it in its session
