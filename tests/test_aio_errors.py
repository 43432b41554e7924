"""Sync and async targets mixed up: a typed InvalidInputError with a one-line hint,
never a bare TypeError, AttributeError or MissingGreenlet; and without the async
extra, ``hermes_store`` still imports and ``hermes_store.aio`` says what to install."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any
from collections.abc import Callable

import pytest
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from hermes_store import SessionDB, UnitOfWork, aio, errors, migrations
from hermes_store.engine import create_engine
from hermes_store.repositories import SearchRepository, SessionRepository

ROOT = Path(__file__).resolve().parent.parent


def _one_line_hint(call: Callable[[], Any], *words: str) -> str:
    with pytest.raises(errors.InvalidInputError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and all(w in message for w in words), message
    return message


def test_the_sync_api_refuses_async_targets(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async_engine = aio.create_async_engine(path)
    try:
        _one_line_hint(lambda: SessionDB(engine=async_engine), "SessionDB", "hermes_store.aio")
        _one_line_hint(lambda: SessionDB(async_engine), "AsyncEngine", "hermes_store.aio")
        _one_line_hint(lambda: UnitOfWork(async_engine), "UnitOfWork", "hermes_store.aio")
        _one_line_hint(lambda: migrations.upgrade(async_engine), "migrations", "hermes_store.aio")
        _one_line_hint(lambda: migrations.current(async_engine), "migrations")
        _one_line_hint(lambda: asyncio.run(aio.upgrade(AsyncSession(async_engine))), "aio.upgrade",
                       "await session.connection()")
        _one_line_hint(lambda: SearchRepository(AsyncSession(async_engine)), "repositories", "AsyncSession")
        _one_line_hint(lambda: SessionDB(f"sqlite+aiosqlite:///{path}"), "aiosqlite", "hermes_store.aio")
        _one_line_hint(lambda: SessionDB("postgresql+asyncpg://u@127.0.0.1:1/x"), "asyncpg", "asyncio driver")
        _one_line_hint(lambda: create_engine("postgresql+asyncpg://u@127.0.0.1:1/x"), "create_engine")
    finally:
        asyncio.run(async_engine.dispose())
    assert not path.exists()  # nothing was created by a refused call


def test_aio_refuses_sync_targets(tmp_path: Path) -> None:
    engine = create_engine(tmp_path / "s.db")
    try:
        _one_line_hint(lambda: aio.AsyncUnitOfWork(engine), "aio.AsyncUnitOfWork", "sync Engine")
        _one_line_hint(lambda: asyncio.run(aio.upgrade(engine)), "aio.upgrade", "create_async_engine")
        _one_line_hint(lambda: asyncio.run(aio.current(engine)), "aio.current")
        _one_line_hint(lambda: aio.AsyncSessionDB(engine), "aio.AsyncSessionDB")
        _one_line_hint(lambda: aio.create_async_engine(engine), "aio.create_async_engine")
        with Session(engine) as session:
            _one_line_hint(lambda: aio.SessionRepository(session), "aio.SessionRepository", "Session")
            _one_line_hint(lambda: migrations.upgrade(session), "migrations", "session.connection()")
        _one_line_hint(lambda: aio.SearchRepository("not a session"), "AsyncSession or AsyncConnection")
    finally:
        engine.dispose()
    with pytest.raises(errors.UnsupportedDatabaseError):
        aio.create_async_engine("mysql+aiomysql://u@h/x")
    assert not (tmp_path / "s.db").exists()


def test_sync_repositories_still_take_a_sync_session(tmp_path: Path) -> None:
    engine = create_engine(tmp_path / "s.db")
    migrations.upgrade(engine)
    try:
        with Session(engine) as session, session.begin():
            SessionRepository(session).create("a", "cli")
        with Session(engine) as session:
            assert SessionRepository(session).get("a")["source"] == "cli"
    finally:
        engine.dispose()


def test_cli_reports_an_async_url_as_a_usage_error(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-c", "import sys; from hermes_store.cli import main; sys.exit(main())",
         "--url", "postgresql+asyncpg://u@127.0.0.1:1/x", "stats"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert run.returncode != 0
    assert "asyncio driver" in run.stderr and "please report" not in run.stderr, run.stderr


def test_without_greenlet_the_sync_api_works_and_aio_names_the_extra(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['greenlet'] = None\n"
        "from hermes_store import SessionDB\n"
        f"db = SessionDB({str(tmp_path / 'g.db')!r}); db.create_session('a', 'cli')\n"
        "assert db.get_session('a')['id'] == 'a'; db.close()\n"
        "try:\n    import hermes_store.aio\nexcept ImportError as exc:\n    print('HINT', exc)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "HINT" in run.stdout and "hermes-store[async]" in run.stdout, run.stdout
