"""factory-boy factories for the ORM models (used with the ``session`` fixture)."""

from __future__ import annotations

import itertools
import json

import factory
from factory.alchemy import SQLAlchemyModelFactory

from hermes_store.models import AgentSession as Session, Message

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
