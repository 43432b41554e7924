"""Issue 30's recipes that failed without a server: a CLI ``upgrade`` in a read-only
folder creates nothing (row 13), and an async engine whose server cannot be reached
says so typed instead of passing the socket's ``OSError`` through (row 9's connection
half; the pooler half is in test_pg_recipes.py)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hermes_store import aio, errors, paths

EXE = Path(sys.executable).with_name("hermes-store")


@pytest.mark.skipif(os.geteuid() != 0, reason=(
    "only root can create a file in a 0555 folder: for anyone else the kernel refuses it, "
    "so the case this guards (root's open() succeeding) cannot happen"
))
@pytest.mark.parametrize("target", ["ro/new.db", "ro/sub/new.db"])
@pytest.mark.parametrize("command", ["upgrade", "demo"])
def test_cli_creates_nothing_in_a_read_only_folder_as_root(tmp_path: Path, command: str, target: str) -> None:
    """Before: ``upgrade`` left a 4,096-byte ``ro/new.db`` behind (rc 1, "left unchanged"),
    and ``ro/sub/new.db`` made ``ro/sub/`` and a whole database in it."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        proc = subprocess.run([EXE, "--json", "--db", target, command], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert sorted(os.listdir(folder)) == [], "something was created in the read-only folder"
        lines = [line for line in proc.stdout.splitlines() + proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, lines
        doc = json.loads(lines[0])
        assert doc["code"] == "read_only_database" and "read-only" in doc["error"], doc
    finally:
        folder.chmod(0o755)


def test_create_private_database_refuses_a_read_only_folder_before_creating(tmp_path: Path) -> None:
    """The helper every creator goes through (the CLI, SessionDB, migrations): typed, nothing made."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(errors.ReadOnlyDatabaseError, match="read-only"):
            paths.create_private_database(folder / "new.db")
        assert os.listdir(folder) == []
    finally:
        folder.chmod(0o755)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_async_engine_that_cannot_reach_its_server_raises_typed() -> None:
    """Before: ``ConnectionRefusedError: [Errno 111]`` reached the caller of ``AsyncUnitOfWork``."""
    async def run() -> BaseException:
        engine = aio.create_async_engine(f"postgresql+asyncpg://postgres@127.0.0.1:{_closed_port()}/x")
        try:
            async with aio.AsyncUnitOfWork(engine):
                pass
        except BaseException as exc:
            return exc
        finally:
            await engine.dispose()
        raise AssertionError("connected to a closed port")

    seen = asyncio.run(run())
    assert isinstance(seen, errors.DatabaseUnavailableError), repr(seen)
    assert isinstance(seen.__cause__, OSError), "the socket's error is chained"
    assert "cannot connect" in str(seen)
