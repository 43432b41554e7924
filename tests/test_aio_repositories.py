"""``aio.AsyncUnitOfWork`` against ``UnitOfWork``: the same repository calls give the same
results and the same typed errors, on aiosqlite, asyncpg and async psycopg (through the
pooler when one runs); a failed unit of work leaves nothing behind on either API; the
async repositories on a host's AsyncSession / AsyncConnection never commit.

The repositories read the clock through ``hermes_store.facade.time`` (``base.now``), which
``frozen_clock`` / ``restart_clock`` freeze: timestamps are compared as they are, no
normalization."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import pytest
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from hermes_store import aio, errors, migrations
from hermes_store.engine import create_engine
from hermes_store.repositories import ApiCallUsage
from hermes_store.uow import UnitOfWork

from .aio_support import ASYNC_DRIVERS, async_url_for, frozen_clock, restart_clock
from .helpers import server_database

__all__ = ["frozen_clock"]  # the fixture, imported for this module

#: (key, repository attribute of the unit of work, method, args, kwargs)
Call = tuple[str, str, str, tuple[Any, ...], dict[str, Any]]

TOOL_CALLS = [{"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{\"cmd\": \"ls\"}"}}]

#: Units of work, each its own transaction; a call that raises ends its unit (rolled back).
UNITS: list[tuple[str, list[Call]]] = [
    ("write", [
        ("create root", "sessions", "create", ("root", "cli"), {"model": "m-1", "system_prompt": "be brief"}),
        ("m1", "messages", "append", ("root", "user", "how do I tune the postgres connection pool?"), {}),
        ("m2", "messages", "append", ("root", "assistant", "set pool_size and max_overflow"),
         {"tool_calls": TOOL_CALLS}),
        ("m3", "messages", "append", ("root", "tool", "pool ok"), {"tool_name": "shell", "tool_call_id": "c1"}),
        ("m4", "messages", "append", ("root", "user", "数据库连接池的配置"), {}),
        ("m5", "messages", "append", ("root", "assistant", "東京の天気はどうですか"), {}),
        ("m6", "messages", "append", ("root", "user", "a\x00b"), {}),
        ("m7", "messages", "append", ("root", "user", "alpha\x00bravo charlie"), {}),
        ("usage 1", "usage", "update_token_counts",
         ("root", ApiCallUsage(input_tokens=120, output_tokens=30, model="m-1", estimated_cost_usd=0.0125,
                               api_call_count=1)), {}),
        ("usage 2", "usage", "update_token_counts",
         ("root", ApiCallUsage(input_tokens=5, output_tokens=2, cache_read_tokens=7, reasoning_tokens=3,
                               model="m-1", actual_cost_usd=0.5, api_call_count=1)), {}),
        ("usage side task", "usage", "update_token_counts",
         ("root", ApiCallUsage(input_tokens=11, model="m-aux", task="title", api_call_count=1)), {}),
        ("title", "sessions", "set_title", ("root", "Pool tuning"), {}),
        ("end root", "sessions", "end", ("root", "compression"), {}),
        ("create mid", "sessions", "create", ("mid", "cli"), {"parent_session_id": "root"}),
        ("bulk mid", "messages", "bulk_append",
         ([{"session_id": "mid", "role": "user", "content": f"follow-up {i} kubernetes"} for i in range(4)],), {}),
        ("end mid", "sessions", "end", ("mid", "compression"), {}),
        ("end mid again", "sessions", "end", ("mid", "user_exit"), {}),  # first end wins: False
        ("create tip", "sessions", "create", ("tip", "cli"), {"parent_session_id": "mid"}),
        ("m tip", "messages", "append", ("tip", "user", "deploy to kubernetes"), {}),
        ("create fork", "sessions", "create", ("fork", "cli"),
         {"parent_session_id": "root", "model_config": {"_branched_from": "root"}}),
        ("create other", "sessions", "create", ("other", "telegram"), {"user_id": "u1", "model": "m-2"}),
        ("m other", "messages", "append", ("other", "user", "deploy the helm chart"), {}),
        ("usage other", "usage", "update_token_counts",
         ("other", ApiCallUsage(input_tokens=1, output_tokens=1, model="m-2", api_call_count=1)), {}),
        ("meta", "maintenance", "set_meta", ("k", "v\x00w"), {}),
    ]),
    ("read", [
        ("get root", "sessions", "get", ("root",), {}),
        ("get missing", "sessions", "get", ("missing",), {}),
        ("get many", "sessions", "get_many", (["tip", "root", "nobody"],), {}),
        ("exists", "sessions", "exists", ("fork",), {}),
        ("prefix ids", "sessions", "ids_with_prefix", ("m", 10), {}),
        ("totals", "sessions", "totals", (), {}),
        ("totals cli", "sessions", "totals", ("cli",), {}),
        ("resolve id", "sessions", "resolve_id", ("ti",), {}),
        ("by title", "sessions", "get_by_title", ("Pool tuning",), {}),
        ("next title", "sessions", "next_title_in_lineage", ("Pool tuning",), {}),
        ("messages root", "messages", "get_messages", ("root",), {}),
        ("messages page", "messages", "get_messages", ("mid",), {"limit": 2, "offset": 1}),
        ("count all", "messages", "count", (), {}),
        ("count mid", "messages", "count", ("mid",), {}),
        ("around", "messages", "around", ("root", 3), {"window": 1}),
        ("conversation", "messages", "lineage_conversation", ("tip",), {}),
        ("resume", "messages", "resume_conversations", ("tip",), {}),
        ("meta", "maintenance", "get_meta", ("k",), {}),
        ("export", "maintenance", "export_session", ("root",), {}),
        ("usage by model", "maintenance", "usage", (), {}),
        ("usage by task", "maintenance", "usage", (), {"by": "task"}),
        # search: words, a prefix, 2-char and 3+-char CJK, NUL in the content and the query
        ("s words", "search", "search_messages", ("postgres pool",), {}),
        ("s limit", "search", "search_messages", ("kubernetes",), {"limit": 3}),
        ("s prefix", "search", "search_messages", ("deplo*",), {}),
        ("s cjk2", "search", "search_messages", ("数据",), {}),
        ("s cjk3", "search", "search_messages", ("東京の天気",), {}),
        ("s nul neighbour", "search", "search_messages", ("charlie",), {}),
        ("s nul query", "search", "search_messages", ("a\x00b",), {}),
        ("s role", "search", "search_messages", ("pool",), {"role_filter": "assistant"}),
        ("s source", "search", "search_messages", ("deploy",), {"source_filter": "telegram"}),
        ("s oldest", "search", "search_messages", ("kubernetes",), {"sort": "oldest"}),
        ("s bad syntax", "search", "search_messages", ('"rate limit" OR (',), {}),
        # lineage: root -(compression)-> mid -(compression)-> tip; fork branches off root
        ("ancestors", "lineage", "ancestors", ("tip",), {}),
        ("ancestors excl", "lineage", "ancestors", ("tip",), {"include_self": False}),
        ("descendants", "lineage", "descendants", ("root",), {}),
        ("root of tip", "lineage", "conversation_root", ("tip",), {}),
        ("tip of root", "lineage", "compression_tip", ("root",), {}),
        ("tip of mid", "lineage", "compression_tip", ("mid",), {}),
        ("tip of unknown", "lineage", "compression_tip", ("nobody",), {}),
        ("resume target", "lineage", "resume_target", ("root",), {}),
        ("lineage mid", "lineage", "compression_lineage", ("mid",), {}),
        ("lineage fork", "lineage", "compression_lineage", ("fork",), {}),
        ("chain", "lineage", "chain", ("mid",), {}),
        ("tips", "lineage", "compression_tips", (["tip", "mid", "other", "fork"],), {}),
        # listing
        ("list", "listing", "list_rich", (), {}),
        ("list children", "listing", "list_rich", (), {"include_children": True, "limit": 3}),
        ("list active", "listing", "list_rich", (), {"order_by_last_active": True, "search_query": "pool-TUNING"}),
        ("list source", "listing", "list_rich", (), {"source": "telegram"}),
        ("list count", "listing", "count", (), {}),
        ("list count roots", "listing", "count", (), {"exclude_children": True}),
        ("list search", "listing", "search", (), {"source": "cli"}),
        ("list by id", "listing", "search_by_id", ("mi",), {}),
        ("rich row", "listing", "rich_row", ("tip",), {}),
    ]),
    # typed errors: each unit writes first, then fails; nothing of it may stay
    ("unknown session", [
        ("ghost", "sessions", "create", ("ghost1", "cli"), {}),
        ("ghost message", "messages", "append", ("ghost1", "user", "written before the failure"), {}),
        # "root" is closed by compression (no append lands there): an open session's
        ("other message", "messages", "append", ("other", "user", "written before the failure"), {}),
        ("fail", "messages", "append", ("nobody", "user", "x"), {}),
        ("never run", "sessions", "create", ("after-failure", "cli"), {}),
    ]),
    ("unknown session in a batch", [
        ("ghost", "sessions", "create", ("ghost2", "cli"), {}),
        ("fail", "messages", "bulk_append",
         ([{"session_id": "root", "role": "user", "content": "kept?"},
           {"session_id": "nobody", "role": "user", "content": "x"}],), {}),
    ]),
    ("bad token count", [
        ("ghost", "sessions", "create", ("ghost3", "cli"), {}),
        ("usage", "usage", "update_token_counts", ("root", ApiCallUsage(input_tokens=1000, api_call_count=1)), {}),
        ("fail", "usage", "update_token_counts",
         ("root", ApiCallUsage(input_tokens="lots")), {}),  # type: ignore[arg-type]
    ]),
    ("flat usage", [
        ("ghost", "sessions", "create", ("ghost4", "cli"), {}),
        ("fail", "usage", "update_token_counts", ("root", {"input_tokens": 1}), {}),
    ]),
    ("session id not a str", [
        ("end other", "sessions", "end", ("other", "user_exit"), {}),
        ("fail", "sessions", "create", (123, "cli"), {}),
    ]),
    ("bad batch item", [
        ("title", "sessions", "set_title", ("other", "Renamed"), {}),
        ("fail", "messages", "bulk_append", ([{"session_id": "root", "content": "no role"}],), {}),
    ]),
    ("null for a not-null column", [
        ("ghost", "sessions", "create", ("ghost5", "cli"), {}),
        ("fail", "sessions", "update_fields", ("root",), {"hidden": None}),
    ]),
    ("commit, then fail", [  # what came before uow.commit() stays
        ("kept", "sessions", "create", ("kept", "cli"), {}),
        ("kept message", "messages", "append", ("kept", "user", "committed half"), {}),
        ("commit", "uow", "commit", (), {}),
        ("ghost", "sessions", "create", ("ghost6", "cli"), {}),
        ("ghost message", "messages", "append", ("ghost6", "user", "x"), {}),
        ("fail", "usage", "update_token_counts",
         ("ghost6", ApiCallUsage(estimated_cost_usd="cheap")), {}),  # type: ignore[arg-type]
    ]),
    ("after the failures", [
        ("ghosts", "sessions", "get_many",
         (["ghost1", "ghost2", "ghost3", "ghost4", "ghost5", "ghost6", "after-failure"],), {}),
        ("kept", "sessions", "get", ("kept",), {}),
        ("kept messages", "messages", "get_messages", ("kept",), {}),
        ("root", "sessions", "get", ("root",), {}),
        ("other", "sessions", "get", ("other",), {}),
        ("count root", "messages", "count", ("root",), {}),
        ("totals", "sessions", "totals", (), {}),
        ("s failed text", "search", "search_messages", ("failure",), {}),
        ("usage by model", "maintenance", "usage", (), {}),
    ]),
]

#: The units that must fail, and how (the exception type, the same on both APIs).
FAILURES = {
    "unknown session": errors.UnknownSessionError,
    "unknown session in a batch": errors.UnknownSessionError,
    "bad token count": errors.InvalidInputError,
    "flat usage": errors.InvalidInputError,
    "session id not a str": errors.InvalidInputError,
    "bad batch item": errors.InvalidInputError,
    "null for a not-null column": errors.InvalidInputError,
    "commit, then fail": errors.InvalidInputError,
}

Results = dict[str, dict[str, Any]]


def _sync_run(url: str | Path) -> Results:
    engine = create_engine(url)
    results: Results = {}
    try:
        for unit, calls in UNITS:
            got: dict[str, Any] = {}
            try:
                with UnitOfWork(engine) as uow:
                    for key, repo, method, args, kwargs in calls:
                        face = uow if repo == "uow" else getattr(uow, repo)
                        got[key] = ("ok", getattr(face, method)(*args, **kwargs))
            except Exception as exc:
                got["raised"] = ("error", type(exc))
            results[unit] = got
    finally:
        engine.dispose()
    return results


async def _async_run(url: str) -> Results:
    engine = aio.create_async_engine(url)
    results: Results = {}
    try:
        for unit, calls in UNITS:
            got: dict[str, Any] = {}
            try:
                async with aio.AsyncUnitOfWork(engine) as uow:
                    for key, repo, method, args, kwargs in calls:
                        face = uow if repo == "uow" else getattr(uow, repo)
                        got[key] = ("ok", await getattr(face, method)(*args, **kwargs))
            except Exception as exc:
                got["raised"] = ("error", type(exc))
            results[unit] = got
    finally:
        await engine.dispose()
    return results


@pytest.fixture(params=list(ASYNC_DRIVERS))
def driver(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def databases(driver: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str | Path, str]]:
    """``(sync target, async URL)``: two fresh databases of the driver's kind, migrated."""
    if ASYNC_DRIVERS[driver] == "sqlite":
        sync_target: str | Path = tmp_path / "sync.db"
        url = async_url_for(driver, sqlite_path=tmp_path / "async.db")
        migrations.upgrade(sync_target)
        asyncio.run(aio.upgrade(url))
        yield sync_target, url
        return
    pg_url = request.getfixturevalue("pg_url")
    url = async_url_for(driver, pg_url=request.getfixturevalue("pg_database"))
    with server_database(pg_url) as sync_db:
        migrations.upgrade(sync_db)
        asyncio.run(aio.upgrade(url))
        yield sync_db, url


def _ok(results: Results, unit: str, key: str) -> Any:
    kind, value = results[unit][key]
    assert kind == "ok", (unit, key, value)
    return value


def _ids(hits: list[dict[str, Any]]) -> list[str]:
    return [h["session_id"] for h in hits]


def test_same_results_as_the_sync_unit_of_work(databases: tuple[str | Path, str], monkeypatch: pytest.MonkeyPatch,
                                               frozen_clock: object) -> None:
    sync_target, url = databases
    restart_clock(monkeypatch)
    expected = _sync_run(sync_target)
    restart_clock(monkeypatch)
    got = asyncio.run(_async_run(url))

    assert list(got) == list(expected) == [u for u, _ in UNITS]
    for unit, _calls in UNITS:
        assert list(got[unit]) == list(expected[unit]), unit
        for key in expected[unit]:
            assert got[unit][key] == expected[unit][key], f"{unit}: {key}"

    # What both agree on is right, not only equal.
    for results in (expected, got):
        _check_write_and_read(results)
        _check_failures(results)


def _check_write_and_read(r: Results) -> None:
    assert all(kind == "ok" for kind, _ in r["write"].values()), r["write"]
    assert all(kind == "ok" for kind, _ in r["read"].values()), r["read"]
    assert _ok(r, "write", "end mid") is True and _ok(r, "write", "end mid again") is False

    root = _ok(r, "read", "get root")
    assert root["system_prompt"] == "be brief" and root["title"] == "Pool tuning"
    assert root["end_reason"] == "compression" and root["message_count"] == 7
    assert (root["input_tokens"], root["output_tokens"], root["api_call_count"]) == (125, 32, 2)
    assert root["estimated_cost_usd"] == pytest.approx(0.0125) and root["actual_cost_usd"] == pytest.approx(0.5)
    assert root["started_at"] == pytest.approx(1_760_000_000.0, abs=1.0)  # the frozen clock's
    assert _ok(r, "read", "get missing") is None
    assert sorted(_ok(r, "read", "get many")) == ["root", "tip"]
    assert _ok(r, "read", "prefix ids") == ["mid"]
    assert _ok(r, "read", "totals") == {"sessions": 5, "messages": 13}
    assert _ok(r, "read", "totals cli") == {"sessions": 4, "messages": 12}
    assert _ok(r, "read", "resolve id") == "tip"
    assert _ok(r, "read", "by title")["id"] == "root"
    assert _ok(r, "read", "next title") == "Pool tuning #2"

    msgs = _ok(r, "read", "messages root")
    assert [m["content"] for m in msgs] == [
        "how do I tune the postgres connection pool?", "set pool_size and max_overflow", "pool ok",
        "数据库连接池的配置", "東京の天気はどうですか", "a\x00b", "alpha\x00bravo charlie",
    ]
    assert msgs[1]["tool_calls"] == TOOL_CALLS and msgs[2]["tool_call_id"] == "c1"
    assert [m["content"] for m in _ok(r, "read", "messages page")] == ["follow-up 1 kubernetes",
                                                                        "follow-up 2 kubernetes"]
    assert _ok(r, "read", "count all") == 13 and _ok(r, "read", "count mid") == 4
    assert [m["content"] for m in _ok(r, "read", "conversation")][-1] == "deploy to kubernetes"
    assert _ok(r, "read", "meta") == "v\x00w"
    assert [m["content"] for m in _ok(r, "read", "export")["messages"]] == [m["content"] for m in msgs]
    assert {row.key for row in _ok(r, "read", "usage by model")} >= {("m-1",), ("m-2",)}

    # search
    assert set(_ids(_ok(r, "read", "s words"))) == {"root"}
    hits = _ok(r, "read", "s limit")
    assert len(hits) == 3 and set(_ids(hits)) <= {"mid", "tip"}
    assert set(_ids(_ok(r, "read", "s prefix"))) == {"tip", "other"}
    cjk2 = _ok(r, "read", "s cjk2")
    assert _ids(cjk2) == ["root"] and cjk2[0]["id"] == msgs[3]["id"]
    cjk3 = _ok(r, "read", "s cjk3")
    assert _ids(cjk3) == ["root"] and cjk3[0]["id"] == msgs[4]["id"]
    nul = _ok(r, "read", "s nul neighbour")
    assert [h["id"] for h in nul] == [msgs[6]["id"]]
    assert [h["role"] for h in _ok(r, "read", "s role")] == ["assistant"]
    assert _ids(_ok(r, "read", "s source")) == ["other"]
    assert _ok(r, "read", "s bad syntax") == []

    # lineage
    assert _ok(r, "read", "ancestors") == ["root", "mid", "tip"]
    assert _ok(r, "read", "ancestors excl") == ["root", "mid"]
    assert set(_ok(r, "read", "descendants")) == {"mid", "tip", "fork"}
    assert _ok(r, "read", "root of tip") == "root"
    assert _ok(r, "read", "tip of root") == "tip" and _ok(r, "read", "tip of mid") == "tip"
    assert _ok(r, "read", "tip of unknown") == "nobody"
    assert _ok(r, "read", "resume target") == "tip"
    assert _ok(r, "read", "lineage mid") == ["root", "mid", "tip"]
    assert _ok(r, "read", "lineage fork") == ["fork"]
    assert _ok(r, "read", "chain") == ["root", "mid", "tip"]
    assert _ok(r, "read", "tips") == {"tip": "root"}

    # listing: root's chain is listed once, as its tip
    listed = _ok(r, "read", "list")
    assert {row["id"] for row in listed} == {"tip", "fork", "other"}
    shown = next(row for row in listed if row["id"] == "tip")
    assert shown["_lineage_root_id"] == "root"
    assert len(_ok(r, "read", "list children")) == 3
    active = _ok(r, "read", "list active")  # the title "Pool tuning" of the chain's root, squeezed
    assert [(row["id"], row.get("_lineage_root_id")) for row in active] == [("tip", "root")]
    assert [row["id"] for row in _ok(r, "read", "list source")] == ["other"]
    assert _ok(r, "read", "list count") == 5 and _ok(r, "read", "list count roots") == 3
    assert {row["id"] for row in _ok(r, "read", "list search")} == {"root", "mid", "tip", "fork"}
    # "mi" is in the chain root -> mid -> tip, listed once as its tip
    assert [(row["id"], row.get("_lineage_root_id")) for row in _ok(r, "read", "list by id")] == [("tip", "root")]
    assert _ok(r, "read", "rich row")["preview"].startswith("deploy to kubernetes")


def _check_failures(r: Results) -> None:
    for unit, exc_type in FAILURES.items():
        assert r[unit].get("raised") == ("error", exc_type), (unit, r[unit])
        assert "fail" not in r[unit], unit  # the failing call returned nothing
    assert "never run" not in r["unknown session"]
    after = r["after the failures"]
    assert all(kind == "ok" for kind, _ in after.values()), after
    assert _ok(r, "after the failures", "ghosts") == {}
    root = _ok(r, "after the failures", "root")
    before = _ok(r, "read", "get root")
    assert root == before  # no message, token or title change survived
    other = _ok(r, "after the failures", "other")
    assert other["ended_at"] is None and other["title"] is None
    assert _ok(r, "after the failures", "count root") == 7
    assert _ok(r, "after the failures", "kept")["message_count"] == 1
    assert [m["content"] for m in _ok(r, "after the failures", "kept messages")] == ["committed half"]
    before_totals = _ok(r, "read", "totals")
    assert _ok(r, "after the failures", "totals") == {"sessions": before_totals["sessions"] + 1,
                                                      "messages": before_totals["messages"] + 1}
    assert _ok(r, "after the failures", "s failed text") == []
    assert _ok(r, "after the failures", "usage by model") == _ok(r, "read", "usage by model")


# ------------------------------------------------------------------ a host's session / connection


async def _visible(engine: Any) -> tuple[Any, int]:
    """``(session "h", its message count)`` as a fresh unit of work sees them."""
    async with aio.AsyncUnitOfWork(engine, write=False) as uow:
        return await uow.sessions.get("h"), await uow.messages.count("h")


async def _host_session(url: str) -> None:
    engine = aio.create_async_engine(url)
    try:
        maker = async_sessionmaker(engine, expire_on_commit=False)
        async with maker() as session:
            assert isinstance(session, AsyncSession)
            async with session.begin():
                assert await aio.SessionRepository(session).create("h", "cli") == "h"
                mid = await aio.MessageRepository(session).append("h", "user", "held by the host")
                assert isinstance(mid, int)
                assert await aio.MessageRepository(session).count("h") == 1  # the host's transaction sees it
                assert session.in_transaction()  # the repositories did not end it
                assert await _visible(engine) == (None, 0)  # nor committed it
                await session.rollback()
        assert await _visible(engine) == (None, 0)

        async with maker() as session:
            async with session.begin():
                await aio.SessionRepository(session).create("h", "cli")
                await aio.MessageRepository(session).append("h", "user", "held by the host")
                assert await _visible(engine) == (None, 0)
            # committed by the host's session.begin() block
        row, count = await _visible(engine)
        assert row is not None and row["message_count"] == 1 and count == 1
    finally:
        await engine.dispose()


async def _host_connection(url: str) -> None:
    engine = aio.create_async_engine(url)
    try:
        async with engine.connect() as conn:
            assert isinstance(conn, AsyncConnection)
            async with conn.begin() as tx:
                await aio.SessionRepository(conn).create("h", "cli")
                await aio.MessageRepository(conn).append("h", "user", "held by the host")
                assert await aio.SessionRepository(conn).exists("h")
                assert conn.in_transaction()
                assert await _visible(engine) == (None, 0)
                await tx.rollback()
        assert await _visible(engine) == (None, 0)

        async with engine.connect() as conn:
            async with conn.begin() as tx:
                await aio.SessionRepository(conn).create("h", "cli")
                await aio.MessageRepository(conn).append("h", "user", "held by the host")
                assert await _visible(engine) == (None, 0)
                await tx.commit()
        row, count = await _visible(engine)
        assert row is not None and row["message_count"] == 1 and count == 1
    finally:
        await engine.dispose()


@pytest.fixture
def async_db(driver: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh migrated database of the driver's kind (its async URL)."""
    if ASYNC_DRIVERS[driver] == "sqlite":
        url = async_url_for(driver, sqlite_path=tmp_path / "host.db")
    else:
        url = async_url_for(driver, pg_url=request.getfixturevalue("pg_database"))
    asyncio.run(aio.upgrade(url))
    return url


def test_host_async_session_rollback_leaves_nothing_commit_keeps(async_db: str) -> None:
    asyncio.run(_host_session(async_db))


def test_host_async_connection_rollback_leaves_nothing_commit_keeps(async_db: str) -> None:
    asyncio.run(_host_connection(async_db))


def test_async_repositories_refuse_sync_executors(tmp_path: Path) -> None:
    engine = create_engine(tmp_path / "s.db")
    try:
        with pytest.raises(errors.InvalidInputError, match="hermes_store's sync API"):
            aio.MessageRepository(engine)
        with engine.connect() as conn, pytest.raises(errors.InvalidInputError, match="not a sync Connection"):
            aio.SessionRepository(conn)
        with pytest.raises(errors.InvalidInputError, match=r"aio\.AsyncUnitOfWork takes an async engine"):
            aio.AsyncUnitOfWork(engine)  # type: ignore[arg-type]
    finally:
        engine.dispose()
