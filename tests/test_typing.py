"""PEP 561: a host's ``mypy --strict`` sees our public types (``py.typed`` ships with the
package): a small host module using the public API checks clean, and a wrong use of our
TypedDict records and return types is reported, so the types are real, not ``Any``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import hermes_store

HOST = '''
from __future__ import annotations

import asyncio
from typing import Any

from hermes_store import SessionDB, UnitOfWork, migrations
from hermes_store import aio
from hermes_store.engine import create_engine
from hermes_store.repositories import ApiCallUsage, SessionRecord


def title_of(path: str) -> str | None:
    migrations.upgrade(path)
    engine = create_engine(path)
    with UnitOfWork(engine) as uow:
        uow.sessions.create("s1", "cli")
        message_id: int = uow.messages.append("s1", "user", "hello")
        uow.usage.update_token_counts("s1", ApiCallUsage(input_tokens=3, model="m"))
        record: SessionRecord | None = uow.sessions.get("s1")
    engine.dispose()
    assert message_id > 0
    return record["title"] if record is not None else None


def facade(path: str) -> int:
    with SessionDB(path) as db:
        db.create_session("s2", "cli")
        return db.append_message("s2", "user", "hi")


async def native(url: str) -> None:
    async with aio.AsyncSessionDB(url) as db:
        await db.create_session("s3", "cli")
        message_id: int = await db.append_message("s3", "user", "hi", tool_name=None)
        hits: list[dict[str, Any]] = await db.search_messages("hi", limit=5)
        exported: list[dict[str, Any]] = await db.iter_export()
        title: str | None = await db.sanitize_title(" t ")
        done: bool = await db.wait_for_upkeep(timeout=1.0)
        assert message_id > 0 and done and title and len(hits) + len(exported) >= 0


asyncio.run(native("sqlite+aiosqlite:///x.db"))
'''

WRONG = '''
from hermes_store import UnitOfWork
from hermes_store.engine import create_engine
from hermes_store.repositories import SessionRecord

with UnitOfWork(create_engine("x.db")) as uow:
    record: SessionRecord | None = uow.sessions.get("s1")
    if record is not None:
        started: str = record["started_at"]
        record["no_such_field"]
'''

#: The sync API's mistakes, awaited: each must be an error as it is in sync code (line: what mypy says).
WRONG_ASYNC = {
    'await db.append_mesage("s", "user", "hi")': '"AsyncSessionDB" has no attribute "append_mesage"',
    'await db.append_message("s", "user", "hi", bogus_kw=1)': 'Unexpected keyword argument "bogus_kw"',
    "await db.search_messages(123)": 'Argument 1 has incompatible type "int"; expected "str"',
    'count: str = await db.append_message("s", "user", "hi")': "Incompatible types in assignment",
    # a method taking **kwargs (its self could not be stripped by a ParamSpec alone)
    "await db.update_session(123, title='t')": 'Argument 1 has incompatible type "int"; expected "str"',
    # a staticmethod of SessionDB, awaited on the instance
    "await db.sanitize_title(1)": 'Argument 1 has incompatible type "int"',
}


#: The same for an async unit of work's repositories (``uow.<attribute>`` of the registry).
WRONG_ASYNC_UOW = {
    'await uow.sessions.misspelt("s")': '"SessionRepository" has no attribute "misspelt"',
    'await uow.sessions.get_title("s", bogus_kw=1)': 'Unexpected keyword argument "bogus_kw"',
    "await uow.search.search_messages(123)": 'Argument 1 has incompatible type "int"; expected "str"',
    'title: int = await uow.sessions.get_title("s")': "Incompatible types in assignment",
}


def _async_uow_host(statements: list[str]) -> str:
    body = "".join(f"        {line}\n" for line in statements)
    return (
        "from sqlalchemy.ext.asyncio import AsyncEngine\n\n"
        "from hermes_store import aio\n\n\n"
        "async def host(engine: AsyncEngine) -> None:\n"
        "    async with aio.AsyncUnitOfWork(engine) as uow:\n"
        f"{body}"
    )


def _async_host(statements: list[str]) -> str:
    body = "".join(f"        {line}\n" for line in statements)
    return (
        "from hermes_store import aio\n\n\n"
        "async def host() -> None:\n"
        '    async with aio.AsyncSessionDB("x.db") as db:\n'
        f"{body}"
    )


def _mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    module = tmp_path / "host.py"
    module.write_text(source)
    env = dict(os.environ)
    where = Path(hermes_store.__file__).resolve().parent.parent
    if where.name != "site-packages":
        # A source checkout (an editable install): mypy does not follow import hooks.
        env["MYPYPATH"] = str(where)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-incremental",
         "--cache-dir", str(tmp_path / ".mypy"), str(module)],
        capture_output=True, text=True, cwd=tmp_path, timeout=600, env=env,
    )


def test_the_package_ships_py_typed() -> None:
    assert (Path(hermes_store.__file__).parent / "py.typed").is_file()


def test_a_host_module_checks_clean_under_strict(tmp_path: Path) -> None:
    run = _mypy(tmp_path, HOST)
    assert run.returncode == 0, run.stdout + run.stderr


def test_wrong_uses_of_our_types_are_reported(tmp_path: Path) -> None:
    run = _mypy(tmp_path, WRONG)
    assert run.returncode == 1, run.stdout + run.stderr
    assert 'Incompatible types in assignment (expression has type "float"' in run.stdout, run.stdout
    assert '"SessionRecord" has no key "no_such_field"' in run.stdout, run.stdout


def test_mistakes_in_awaited_calls_are_reported_like_sync_ones(tmp_path: Path) -> None:
    """The async API is typed method by method, not as ``(*Any, **Any) -> Awaitable[Any]``."""
    run = _mypy(tmp_path, _async_host(list(WRONG_ASYNC)))
    assert run.returncode == 1, run.stdout + run.stderr
    errors = [line for line in run.stdout.splitlines() if ": error:" in line]
    assert len(errors) == len(WRONG_ASYNC), run.stdout
    for line_no, (statement, message) in enumerate(WRONG_ASYNC.items(), start=6):
        assert any(f"host.py:{line_no}:" in e and message in e for e in errors), (statement, run.stdout)


def test_a_clean_async_host_checks_clean(tmp_path: Path) -> None:
    """The async mistakes' own host, with the mistakes corrected: the errors above are theirs."""
    fixed = ['await db.append_message("s", "user", "hi")', 'await db.append_message("s", "user", "hi", tool_name="t")',
             'await db.search_messages("hi")', 'count: int = await db.append_message("s", "user", "hi")',
             "await db.update_session('s', title='t')", "await db.sanitize_title('t')"]
    run = _mypy(tmp_path, _async_host(fixed))
    assert run.returncode == 0, run.stdout + run.stderr


def test_mistakes_in_awaited_unit_of_work_calls_are_reported_like_sync_ones(tmp_path: Path) -> None:
    """``uow.sessions`` of an AsyncUnitOfWork is typed as the async face of SessionRepository,
    each method as the sync one awaited (not ``Any``, which would accept every line below)."""
    run = _mypy(tmp_path, _async_uow_host(list(WRONG_ASYNC_UOW)))
    assert run.returncode == 1, run.stdout + run.stderr
    errors = [line for line in run.stdout.splitlines() if ": error:" in line]
    assert len(errors) == len(WRONG_ASYNC_UOW), run.stdout
    for line_no, (statement, message) in enumerate(WRONG_ASYNC_UOW.items(), start=8):
        assert any(f"host.py:{line_no}:" in e and message in e for e in errors), (statement, run.stdout)


def test_a_clean_async_unit_of_work_host_checks_clean(tmp_path: Path) -> None:
    """The unit-of-work mistakes' own host, corrected: the errors above are theirs."""
    fixed = ['await uow.sessions.get_title("s")', 'await uow.messages.append("s", "user", "hi", tool_name="t")',
             'hits: list[SearchHit] = await uow.search.search_messages("hi")',
             'title: str | None = await uow.sessions.get_title("s")',
             'record: SessionRecord | None = await uow.sessions.get("s")',
             'await uow.sessions.get_title(session_id="s")']
    source = _async_uow_host(fixed).replace(
        "from hermes_store import aio\n",
        "from hermes_store import aio\nfrom hermes_store.repositories import SearchHit, SessionRecord\n")
    run = _mypy(tmp_path, source)
    assert run.returncode == 0, run.stdout + run.stderr
