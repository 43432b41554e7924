"""Test data: factory-boy factories for the ORM models (used with the ``session``
fixture), and builders that shape rows of a SessionDB the way Hermes' API cannot
(times in the past, hand-made lineage). The builders write through a public
:class:`~hermes_store.uow.UnitOfWork` on the store's engine, never ``SessionDB._write``."""

from __future__ import annotations

import itertools
import json
from typing import Any
from collections.abc import Iterable, Mapping

import factory
from factory.alchemy import SQLAlchemyModelFactory
from sqlalchemy import insert, update

from hermes_store import SessionDB
from hermes_store.models import AgentSession as Session, Message
from hermes_store.models import Base
from hermes_store.uow import UnitOfWork

SESSIONS = Base.metadata.tables["sessions"]
MESSAGES = Base.metadata.tables["messages"]

_clock = itertools.count()


def _tick() -> float:
    return 1_700_000_000.0 + next(_clock)


class SessionFactory(SQLAlchemyModelFactory):
    class Meta:
        model = Session
        sqlalchemy_session_persistence = "flush"

    id = factory.Sequence(lambda n: f"sess_{n:05d}")
    source = factory.Iterator(["cli", "telegram", "tui"])
    model = "anthropic/claude-sonnet-4"
    started_at = factory.LazyFunction(_tick)
    message_count = 0
    tool_call_count = 0


class MessageFactory(SQLAlchemyModelFactory):
    class Meta:
        model = Message
        sqlalchemy_session_persistence = "flush"

    session = factory.SubFactory(SessionFactory)
    role = "user"
    content = factory.Faker("sentence")
    timestamp = factory.LazyFunction(_tick)

    class Params:
        tool_call = factory.Trait(
            role="assistant",
            content=None,
            tool_calls=factory.LazyFunction(
                lambda: json.dumps([{"id": "call_1", "type": "function",
                                     "function": {"name": "web_search", "arguments": '{"q": "zebra"}'}}])
            ),
        )
        tool_result = factory.Trait(role="tool", tool_name="web_search", tool_call_id="call_1")


def set_times(store: SessionDB, session_id: str, *, started_at: float | None = None, ended_at: float | None = None,
              end_reason: str | None = None, messages_at: float | None = None) -> None:
    """Place a session in time (Hermes stamps times itself): ``started_at`` when given,
    ``ended_at`` and ``end_reason`` always (None reopens), and the timestamp of every
    message of the session when ``messages_at`` is given (prune reads inactivity from
    the newest message)."""
    fields: dict[str, Any] = {"ended_at": ended_at, "end_reason": end_reason}
    if started_at is not None:
        fields["started_at"] = started_at
    with UnitOfWork(store.engine) as uow:
        uow.sessions.update_fields(session_id, **fields)
        if messages_at is not None:
            uow.conn.execute(update(MESSAGES).where(MESSAGES.c.session_id == session_id)
                             .values(timestamp=messages_at))


def insert_sessions(store: SessionDB, rows: Iterable[Mapping[str, Any]],
                    parents: Mapping[str, str] | None = None) -> None:
    """Insert session rows as given (no Hermes upsert rules), then point each id of
    ``parents`` at its parent: links set afterwards can close a cycle, as a corrupt file has."""
    with UnitOfWork(store.engine) as uow:
        assert uow.conn is not None
        uow.conn.execute(insert(SESSIONS), [dict(r) for r in rows])
        for sid, parent in (parents or {}).items():
            uow.conn.execute(update(SESSIONS).where(SESSIONS.c.id == sid).values(parent_session_id=parent))
