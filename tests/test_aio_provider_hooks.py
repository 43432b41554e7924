"""Hermes v30's write hooks on ``aio.AsyncSessionDB``: a pre-commit hook runs inside the
write transaction (a raise rolls the write back, on every async driver, concurrent
appends included) and a post-write hook after the commit only."""

from __future__ import annotations

import asyncio
import contextvars
from pathlib import Path

import pytest

from hermes_store import aio

from .aio_support import ASYNC_DRIVERS, async_url_for


class Veto(Exception):
    pass


@pytest.fixture(params=list(ASYNC_DRIVERS))
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if ASYNC_DRIVERS[request.param] == "sqlite":
        return async_url_for(request.param, sqlite_path=tmp_path / "a.db")
    return async_url_for(request.param, pg_url=request.getfixturevalue("pg_database"))


async def _scenario(url: str) -> dict:
    async with aio.AsyncSessionDB(url) as db:
        await db.create_session("s", "cli")
        refused: set[str] = {"t2-3", "t0-9", "title"}
        in_flight: contextvars.ContextVar[str] = contextvars.ContextVar("in_flight")
        post: list[str] = []

        def veto(conn) -> None:
            # The hook runs in the calling task's context: it knows which append it guards.
            if in_flight.get() in refused:
                raise Veto(in_flight.get())

        await db.add_pre_commit_hook(veto)
        await db.add_post_write_hook(lambda: post.append("post"))

        async def writer(t: int) -> list[str]:
            lost = []
            for i in range(12):
                text = f"t{t}-{i}"
                in_flight.set(text)
                try:
                    await db.append_message("s", "user", text)
                except Veto:
                    lost.append(text)
            return lost

        lost = [x for part in await asyncio.gather(*(writer(t) for t in range(3))) for x in part]
        # A write that is not an append (its own transaction, COMMIT by the facade).
        in_flight.set("title")
        try:
            await db.set_session_title("s", "never lands")
        except Veto:
            lost.append("title")
        in_flight.set("meta")
        await db.set_meta("k", "v")
        messages = [m["content"] for m in await db.get_messages("s")]
        session = await db.get_session("s")
        await db.clear_write_hooks()
        return {"lost": lost, "messages": messages, "count": session["message_count"], "post": len(post),
                "title": session["title"], "meta": await db.get_meta("k")}


def test_hooks_veto_and_observe_on_every_async_driver(url: str) -> None:
    out = asyncio.run(_scenario(url))
    kept = out["messages"]
    # Exactly the refused appends are gone; every other one is there, once.
    assert sorted(out["lost"]) == ["t0-9", "t2-3", "title"]
    assert out["title"] is None and out["meta"] == "v"
    assert len(kept) == 34 == out["count"]
    assert not set(kept) & set(out["lost"])
    assert out["post"] == len(kept) + 1  # one per committed append and the meta write, none for a veto
