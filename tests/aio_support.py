"""Shared pieces of the ``hermes_store.aio`` tests: the driver matrix, a deterministic
clock (so a sync run and an async run of the same calls give equal rows), and the
scenario of facade calls whose results both APIs must agree on."""

from __future__ import annotations

import itertools
import time as real_time
from typing import Any
from collections.abc import Iterator

import pytest
from sqlalchemy.engine import make_url

#: aio drivers and the database kind each runs on.
ASYNC_DRIVERS = {"aiosqlite": "sqlite", "asyncpg": "postgresql", "psycopg_async": "postgresql"}


def async_url_for(driver: str, sqlite_path: Any = None, pg_url: str | None = None) -> str:
    """The URL of the test database for ``driver``."""
    if ASYNC_DRIVERS[driver] == "sqlite":
        return f"sqlite+aiosqlite:///{sqlite_path}"
    name = "postgresql+asyncpg" if driver == "asyncpg" else "postgresql+psycopg"
    assert pg_url is not None
    return make_url(pg_url).set(drivername=name).render_as_string(hide_password=False)


class FrozenClock:
    """``time`` for the facade module: ``time()`` counts up from a fixed start by 1 ms
    per call; everything else is the real module (sleeps, monotonic budgets)."""

    def __init__(self, start: float = 1_760_000_000.0) -> None:
        self._ticks: Iterator[int] = itertools.count()
        self._start = start

    def time(self) -> float:
        return self._start + next(self._ticks) / 1000

    def __getattr__(self, name: str) -> Any:
        return getattr(real_time, name)


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> FrozenClock:
    """Patch the clock the facade and the repositories read: ``hermes_store.facade.time``
    (a SessionDB's) and the repositories' default (``repositories.base.time``, a unit of work's)."""
    import hermes_store.facade as facade
    from hermes_store.repositories import base

    clock = FrozenClock()
    monkeypatch.setattr(facade, "time", clock)
    monkeypatch.setattr(base, "time", clock)
    return clock


def restart_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start the clock again from the same instant (before the second run)."""
    import hermes_store.facade as facade
    from hermes_store.repositories import base

    clock = FrozenClock()
    monkeypatch.setattr(facade, "time", clock)
    monkeypatch.setattr(base, "time", clock)


#: (method, args, kwargs): a conversation life cycle touching every family of the facade.
SCENARIO: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("create_session", ("root", "cli"), {"model": "m-1", "system_prompt": "be brief"}),
    ("append_message", ("root", "user", "how do I tune the postgres connection pool?"), {}),
    ("append_message", ("root", "assistant", "set pool_size and max_overflow"),
     {"tool_calls": [{"id": "c1", "function": {"name": "shell", "arguments": "{}"}}]}),
    ("append_message", ("root", "tool", "pool ok \x00 nul kept"), {"tool_name": "shell", "tool_call_id": "c1"}),
    ("append_message", ("root", "user", "数据库连接池的配置"), {}),
    ("append_message", ("root", "assistant", "東京の天気はどうですか"), {}),
    ("update_token_counts", ("root",), {"input_tokens": 120, "output_tokens": 30, "model": "m-1",
                                        "estimated_cost_usd": 0.0125, "api_call_count": 1}),
    ("set_session_title", ("root", "Pool tuning"), {}),
    ("end_session", ("root", "compression"), {}),
    ("create_session", ("child", "cli"), {"parent_session_id": "root"}),
    ("append_messages", ([{"session_id": "child", "role": "user", "content": f"follow-up {i} kubernetes"}
                          for i in range(5)],), {}),
    ("create_session", ("other", "telegram"), {"user_id": "u1"}),
    ("append_message", ("other", "user", "deploy the helm chart"), {}),
    ("set_meta", ("k", "v\x00w"), {}),
    ("get_meta", ("k",), {}),
    ("get_session", ("root",), {}),
    ("get_session", ("missing",), {}),
    ("get_messages", ("root",), {}),
    ("get_messages_as_conversation", ("child",), {"include_ancestors": True}),
    ("search_messages", ("postgres pool",), {}),
    ("search_messages", ("kubernetes",), {"limit": 3}),
    ("search_messages", ("deploy*",), {}),
    ("search_messages", ("数据",), {}),
    ("search_messages", ("東京の天気",), {}),
    ("search_messages", ('"rate limit" OR (',), {}),
    ("search_sessions", (), {"source": "cli"}),
    ("list_sessions_rich", (), {}),
    ("list_sessions_rich", (), {"include_children": True, "limit": 2}),
    ("session_count", (), {}),
    ("message_count", (), {}),
    ("message_count", ("child",), {}),
    ("get_session_lineage", ("child",), {}),
    ("get_compression_tip", ("root",), {}),
    ("get_compression_lineage", ("child",), {}),
    ("get_session_by_title", ("Pool tuning",), {}),
    ("resolve_session_id", ("chi",), {}),
    ("get_resume_conversations", ("child",), {}),
    ("export_session", ("root",), {}),
    ("set_session_title", ("other", "Pool tuning"), {}),  # a clash: TitleConflictError
    ("append_message", ("nobody", "user", "x"), {}),      # UnknownSessionError
    ("create_session", ("", "cli"), {}),                  # refused input
    ("delete_session", ("other",), {}),
    ("session_count", (), {}),
    ("prune_sessions", (), {"older_than_days": 0}),
    ("session_count", (), {}),
]


def outcome(call: Any) -> Any:
    """``("ok", result)`` or ``("error", exception type name)``: what a caller sees."""
    try:
        return ("ok", call())
    except Exception as exc:
        return ("error", type(exc).__name__)


async def async_outcome(awaitable: Any) -> Any:
    try:
        return ("ok", await awaitable)
    except Exception as exc:
        return ("error", type(exc).__name__)
