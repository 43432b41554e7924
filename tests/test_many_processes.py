"""Issue 29, point 2: the same-process and many-process patterns, as the field runs them.

Nine writer processes on one store; in each, other threads keep opening, using and
closing further ``SessionDB`` objects, engines, ``UnitOfWork`` objects and the read-only
CLI on the same store; one more process runs checkpoints, ``vacuum()``,
``maybe_auto_prune_and_vacuum()`` and searches in a loop (tests/many_process_worker.py
has the processes and the checks). Afterwards every acknowledged message is there with
its content and is found by search, no id was acknowledged twice, ended sessions stay
ended, token counts add up, the file and every FTS index pass their integrity checks,
no process held a deleted ``-wal``/``-shm`` open, and every error a caller met was a
``HermesStoreError`` (a ``DatabaseLockedError`` after the write budget is allowed).

Nothing here is timed: the processes run for a few seconds (``HERMES_STORE_FIELD_SECONDS``,
default 4; ``HERMES_STORE_FIELD_PROCESSES``, default 9) and every check is on what they
were told and what the store holds. ``bench/field.py`` runs the same scenario longer and
repeatedly, and prints the figures.

On the code before issue 29's fixes (7b829f2, SQLite 3.40.1, 9 writers x 4 s) the SQLite
case failed every run: the file ended "database disk image is malformed", ids were
acknowledged to two processes, every writer held a deleted ``-wal``/``-shm`` open, and
hundreds of raw ``sqlite3.DatabaseError``s reached callers.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .helpers import PG_URL_ENV, PGBOUNCER_URL_ENV, required_env, server_database, via_pooler
from .many_process_worker import FieldResult, run_field

pytestmark = pytest.mark.slow

SECONDS = float(os.environ.get("HERMES_STORE_FIELD_SECONDS", "4"))
PROCESSES = int(os.environ.get("HERMES_STORE_FIELD_PROCESSES", "9"))


def _assert_held(result: FieldResult, writers: int) -> None:
    problems = result.problems()
    assert not problems, "\n".join(problems) + f"\nsummary: {result.summary()}"
    # The run proves something only if every writer was acknowledged writes.
    by_writer = {r["index"]: len(r["acks"]) for r in result.records if r["role"] == "writer"}
    assert len(by_writer) == writers and all(by_writer.values()), f"acknowledged per writer: {by_writer}"
    maint = next(r for r in result.records if r["role"] == "maint")
    assert maint["counts"].get("maint: search_messages"), f"the maintenance process did nothing: {maint['counts']}"


def test_nine_processes_with_same_process_stores_on_one_sqlite_file(tmp_path: Path) -> None:
    result = run_field(str(tmp_path / "state.db"), tmp_path / "work", processes=PROCESSES, seconds=SECONDS)
    assert result.integrity == ["ok"], result.summary()
    assert result.fts_integrity and set(result.fts_integrity.values()) == {"ok"}, result.fts_integrity
    assert {"messages_fts", "messages_fts_trigram"} <= set(result.fts_integrity), result.fts_integrity
    _assert_held(result, PROCESSES)


def _pg_server() -> str:
    return required_env(PG_URL_ENV, "PostgreSQL tests", "start a server with")


def test_nine_processes_on_one_postgresql_database(tmp_path: Path) -> None:
    with server_database(_pg_server()) as url:
        result = run_field(url, tmp_path / "work", processes=PROCESSES, seconds=SECONDS)
    _assert_held(result, PROCESSES)


def test_writers_through_pgbouncer(tmp_path: Path) -> None:
    """Through the transaction pooler (2 server connections for every client): fewer
    writers, the same checks. The store is made through the direct URL first."""
    pg_url = _pg_server()
    pooler = required_env(PGBOUNCER_URL_ENV, "pooler tests", "it is started by")
    with server_database(pg_url) as url:
        from .many_process_worker import prepare

        prepare(url)
        result = run_field(via_pooler(url, pooler), tmp_path / "work", processes=3, seconds=SECONDS)
    _assert_held(result, 3)
