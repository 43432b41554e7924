"""ORM models on a migrated database, through the SAVEPOINT test fixture and factories.

Also the Python 3.11 sqlite3 trap: joining a test session to an outer transaction only
isolates tests when the engine emits its own BEGIN. These tests prove nothing leaks.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import InvalidRequestError
from sqlalchemy.orm import selectinload

from hermes_store.models import AgentSession as Session, SessionModelUsage

from .factories import MessageFactory, SessionFactory


@pytest.fixture(autouse=True)
def _bind_factories(session):
    for factory in (SessionFactory, MessageFactory):
        factory._meta.sqlalchemy_session = session
    yield


def test_factories_write_through_the_models(session) -> None:
    msg = MessageFactory(tool_call=True)
    tool = MessageFactory(session=msg.session, tool_result=True, content="output")
    session.commit()  # releases the SAVEPOINT only; the outer transaction stays open
    loaded = session.scalars(
        select(Session).where(Session.id == msg.session_id).options(selectinload(Session.messages))
    ).one()
    assert [m.id for m in loaded.messages] == [msg.id, tool.id]
    assert json.loads(loaded.messages[0].tool_calls)[0]["function"]["name"] == "web_search"
    # triggers ran inside the test's transaction: the FTS indexes know the new rows
    def fts(table: str, match: str) -> list[int]:
        sql = text(f"SELECT rowid FROM {table} WHERE {table} MATCH :q ORDER BY rowid")
        return session.execute(sql, {"q": match}).scalars().all()

    assert fts("messages_fts", 'tool_name : "web_search"') == [tool.id]  # the tool name column
    assert fts("messages_fts", 'tool_calls : "web_search"') == [msg.id]  # the name inside the tool call
    assert fts("messages_fts", "zebra") == [msg.id]  # and the call's arguments
    assert fts("messages_fts", "output") == [tool.id]
    # The trigram index (v30) keeps neither tool rows nor tool calls: content and tool name only.
    user = MessageFactory(session=msg.session, content="quokkas everywhere")
    session.commit()
    assert fts("messages_fts_trigram", "okka") == [user.id]
    assert fts("messages_fts_trigram", "zebra") == []
    assert fts("messages_fts_trigram", "output") == []


def test_lazy_loads_are_refused(session) -> None:
    s = SessionFactory()
    session.commit()
    session.expire_all()
    again = session.get(Session, s.id)
    with pytest.raises(InvalidRequestError):
        _ = again.messages  # relationships are raise_on_sql: no accidental N+1


def test_ledger_rows_cascade_with_the_session(session) -> None:
    s = SessionFactory()
    session.add(SessionModelUsage(session_id=s.id, model="m", input_tokens=5))
    session.flush()
    session.delete(s)
    session.flush()
    assert session.scalars(select(SessionModelUsage)).all() == []


@pytest.mark.parametrize("attempt", [1, 2])
def test_fixture_does_not_leak_rows(session, head_db: Path, attempt: int) -> None:
    """Runs twice: each time the table must start empty, and stay empty on disk."""
    assert session.scalars(select(Session)).all() == []
    SessionFactory.create_batch(3)
    session.commit()
    assert len(session.scalars(select(Session)).all()) == 3
    outside = sqlite3.connect(head_db)
    assert outside.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0  # not committed to the file
    outside.close()
