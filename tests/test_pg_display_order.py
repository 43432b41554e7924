"""Hermes v30's display_order rules hold on both backends (hs0004 on PostgreSQL, 0030's
triggers on SQLite): the same writes leave the same display_order in every row."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from hermes_store import SessionDB

pytestmark = pytest.mark.both_backends


def orders(store: SessionDB, session_id: str) -> list[tuple[int, int | None]]:
    return [(m["id"], m["display_order"]) for m in store._read(
        lambda c: c.execute(text("SELECT id, display_order FROM messages WHERE session_id = :s ORDER BY id"),
                            {"s": session_id}).mappings().all())]


def run(store: SessionDB, sql: str, **params) -> None:
    store._write(lambda c: c.execute(text(sql), params))


def test_new_rows_take_their_own_id_or_a_visible_peers_order(db: SessionDB) -> None:
    db.create_session("s", "cli")
    a = db.append_message("s", "user", "one")
    b = db.append_message("s", "assistant", "two")
    assert orders(db, "s") == [(a, a), (b, b)]
    # Two rows sharing an identity (Hermes sets it when a streamed turn is rewritten).
    run(db, "UPDATE messages SET display_identity = :i WHERE id = :id", i=b"k", id=a)
    run(db, "INSERT INTO messages (session_id, role, content, timestamp, display_identity)"
            " VALUES ('s', 'assistant', 'again', 3, :i)", i=b"k")
    rows = orders(db, "s")
    assert rows[-1][1] == a  # takes the visible peer's place on screen


def test_hiding_and_showing_a_row_moves_its_peers(db: SessionDB) -> None:
    db.create_session("s", "cli")
    a = db.append_message("s", "user", "one")
    b = db.append_message("s", "user", "two")
    run(db, "UPDATE messages SET display_identity = :i WHERE id IN (:a, :b)", i=b"k", a=a, b=b)
    run(db, "UPDATE messages SET display_order = :a WHERE id IN (:a, :b)", a=a, b=b)
    run(db, "UPDATE messages SET active = 0 WHERE id = :a", a=a)  # a hidden: b is alone
    assert dict(orders(db, "s"))[b] == b
    run(db, "UPDATE messages SET active = 1 WHERE id = :a", a=a)  # back: both at min(a, peer)
    assert dict(orders(db, "s")) == {a: a, b: a}


def test_an_edit_clears_identity_and_order_and_a_delete_hands_order_on(db: SessionDB) -> None:
    db.create_session("s", "cli")
    a = db.append_message("s", "user", "one")
    b = db.append_message("s", "user", "two")
    c = db.append_message("s", "user", "three")
    run(db, "UPDATE messages SET display_identity = :i, display_order = :a WHERE id IN (:a, :b, :c)",
        i=b"k", a=a, b=b, c=c)
    run(db, "DELETE FROM messages WHERE id = :a", a=a)
    assert dict(orders(db, "s")) == {b: b, c: b}
    run(db, "UPDATE messages SET content = 'edited' WHERE id = :c", c=c)
    assert dict(orders(db, "s")) == {b: None, c: None}
