"""Every file we create is 0600, whichever entry point creates it (create_engine,
UnitOfWork, migrations, the alembic command line, SessionDB, aio), and a missing
folder is created (0700) or refused in one line that names the path."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hermes_store import SessionDB, UnitOfWork, aio, errors, migrations
from hermes_store.engine import create_engine

ROOT = Path(__file__).resolve().parent.parent


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def _open_umask() -> None:
    """A umask that would give 0644 files and 0755 folders, as on most machines."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_create_engine_then_upgrade_leaves_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "perm.db"
    engine = create_engine(path)
    with engine.connect():
        pass
    engine.dispose()
    assert _mode(path) == 0o600
    migrations.upgrade(path)
    assert _mode(path) == 0o600
    wal = Path(f"{path}-wal")
    with SessionDB(path) as db:
        db.create_session("a", "cli")
        assert wal.exists() and _mode(wal) == 0o600  # SQLite gives sidecars the file's mode


def test_unit_of_work_and_migrations_on_an_engine_create_private_files(tmp_path: Path) -> None:
    path = tmp_path / "uow.db"
    engine = create_engine(path)
    migrations.upgrade(engine)
    with UnitOfWork(engine) as uow:
        uow.sessions.create("a", "cli")
    engine.dispose()
    assert _mode(path) == 0o600


def test_missing_folders_are_created_private(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "deep.db"
    engine = create_engine(path)
    migrations.upgrade(engine)
    engine.dispose()
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700 and _mode(tmp_path / "a") == 0o700


def test_a_file_in_the_way_of_the_folder_is_one_typed_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    path = tmp_path / "file" / "x.db"
    engine = create_engine(path)
    try:
        with pytest.raises(errors.HermesStoreError) as info:
            with engine.connect():
                pass
    finally:
        engine.dispose()
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_aio_engines_create_private_files(tmp_path: Path) -> None:
    path = tmp_path / "n" / "async.db"

    async def run() -> None:
        engine = aio.create_async_engine(path)
        await aio.upgrade(engine)
        await engine.dispose()

    asyncio.run(run())
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700


def test_the_alembic_command_line_creates_a_private_file_and_its_folder(tmp_path: Path) -> None:
    home = tmp_path / "no-hermes-home-yet"
    env = {**os.environ, "HERMES_HOME": str(home)}
    env.pop("HERMES_STORE_URL", None)
    run = subprocess.run([sys.executable, "-m", "alembic", "upgrade", "head"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    db = home / "state.db"
    assert _mode(db) == 0o600 and _mode(home) == 0o700
