"""hermes_store on a Citus cluster (issue 33): each tenant schema a distributed schema
(schema-based sharding), living whole on one worker node, placed and moved by Citus.

These cases run against the real cluster ``scripts/citus-test-cluster`` starts (a
coordinator and 2 workers, Citus built from the vendored source); ``.ci/run`` starts
it, and under CI=true a missing cluster fails them instead of skipping.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from hermes_store import SessionDB, errors, facade, migrations, paths, tenancy
from hermes_store.copying import copy_history
from hermes_store.dialects import pg_citus
from hermes_store.engine import create_engine, with_schema
from hermes_store.tenancy import distribute_tenant, list_tenants, move_tenant

from .test_cli import ok, one_line_error, run


def migrated_with_rows(url: str, schema: str, rows: int) -> None:
    """``schema`` at head, with session ``s`` holding ``rows`` messages (each with CJK)."""
    migrations.upgrade(url, schema=schema)
    db = SessionDB(with_schema(url, schema))
    try:
        db.create_session("s", "cli")
        for n in range(rows):
            db.append_message("s", "user", f"row {n} before 数据库")
    finally:
        db.close()


@contextlib.contextmanager
def plain_tenant(url: str, prefix: str, rows: int) -> Iterator[str]:
    """A tenant in a schema of the coordinator made with sharding off (not distributed),
    at head with ``rows`` messages; dropped afterwards."""
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        migrated_with_rows(url, schema, rows)
        yield schema
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        engine.dispose()


def placement(url: str, schema: str) -> list[tuple[Any, ...]]:
    """(table, citus_table_type, colocation) of each distributed table of ``schema``."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(
                "SELECT table_name::text, citus_table_type, colocation_id FROM citus_tables"
                " WHERE table_name::text LIKE :p ORDER BY 1"), {"p": f"{schema}.%"})]
    finally:
        engine.dispose()


def test_a_new_tenant_in_a_distributed_schema_migrates_and_works(citus_tenant: tuple[str, str]) -> None:
    """Failure 1 of issue 33: our revisions create triggers, which Citus refuses on
    distributed tables unless ``citus.enable_unsafe_triggers`` is on. The migration run
    sets it for its own transaction only (``dialects.pg_citus``); the tenant reaches head
    as co-located single-shard tables, and the facade's writes and searches work there."""
    url, schema = citus_tenant
    assert migrations.upgrade(url, schema=schema) == paths.head()
    tables = placement(url, schema)
    assert {t[0].split(".", 1)[1].strip('"') for t in tables} >= {"sessions", "messages", "state_meta"}
    assert {t[1] for t in tables} == {"schema"} and len({t[2] for t in tables}) == 1, tables
    db = SessionDB(with_schema(url, schema))
    try:
        db.create_session("s", "cli")
        ids = [db.append_message("s", "user", content) for content in (
            "deploy the kubernetes cluster", "数据库迁移已经完成", "今天讨论A2A通信协议")]
        assert db.get_session("s")["message_count"] == 3
        assert [h["id"] for h in db.search_messages("kubernetes")] == [ids[0]]
        assert [h["id"] for h in db.search_messages("数据库")] == [ids[1]]
        assert [h["id"] for h in db.search_messages("迁移")] == [ids[1]]
        assert [h["id"] for h in db.search_messages("A2A")] == [ids[2]]
        assert [m["content"] for m in db.get_messages("s")] == ["deploy the kubernetes cluster", "数据库迁移已经完成", "今天讨论A2A通信协议"]
    finally:
        db.close()
    engine = create_engine(url)
    try:
        with engine.connect() as conn:  # the setting was the run's own: nothing is left on a session
            assert conn.exec_driver_sql("SELECT current_setting('citus.enable_unsafe_triggers')").scalar() == "off"
    finally:
        engine.dispose()


def test_a_copy_into_a_distributed_tenant_leaves_its_ids_moving(citus_tenant: tuple[str, str], tmp_path: Any) -> None:
    """Failure 4 of issue 33: after a copy (explicit ids) the identity is moved past them.
    Read in the same statement as the table, Citus ran ``setval`` on the worker, whose
    copy of the sequence has another range, and the next append failed on a duplicate
    id. The largest id is read first, then the coordinator's sequence is set."""

    url, schema = citus_tenant
    source = tmp_path / "state.db"
    db = SessionDB(source)
    try:
        db.create_session("s", "cli")
        for n in range(25):
            db.append_message("s", "user", f"row {n} 数据库")
    finally:
        db.close()
    target = with_schema(url, schema)
    report = copy_history(source, target)  # verified: a mismatch raises CopyVerificationError
    assert report.messages_copied == 25 and report.sessions_copied == 1
    db = SessionDB(target)
    try:
        new_id = db.append_message("s", "user", "after the copy")
        assert new_id > 25
        assert db.get_session("s")["message_count"] == 26
        assert [h["id"] for h in db.search_messages("数据库")][:1] == [25]
    finally:
        db.close()


def _node_of(conn: Any, schema: str) -> tuple[str, int]:
    row = conn.execute(text("SELECT nodename, nodeport FROM citus_shards WHERE table_name = CAST(:t AS regclass)"),
                       {"t": f'"{schema}".sessions'}).one()
    return str(row[0]), int(row[1])


def _workers(conn: Any) -> list[tuple[str, int]]:
    return [(str(r[0]), int(r[1])) for r in conn.execute(text(
        "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid <> 0 AND noderole = 'primary' ORDER BY nodeport"))]


def _checksums(conn: Any, schema: str) -> dict[str, tuple[int, str]]:
    """(rows, md5 of the rows in key order) of the tenant's main tables."""
    out = {}
    for table, key in (("sessions", "id"), ("messages", "id"), ("schema_version", "version"),
                       ("state_meta", "key")):
        row = conn.execute(text(f'SELECT count(*), md5(COALESCE(string_agg(t::text, \'|\' ORDER BY t.{key}), \'\'))'
                                f' FROM "{schema}".{table} t')).one()
        out[table] = (int(row[0]), str(row[1]))
    return out


def test_a_tenant_moves_to_the_other_worker_in_citus_default_mode(citus_tenant: tuple[str, str]) -> None:
    """Failure 3 of issue 33: Citus moves a tenant by logical replication, which needs a
    key or replica identity on every table; Hermes' ``schema_version`` had neither
    (revision hs0007 gives it one). The move keeps every row, and the store works after it."""
    url, schema = citus_tenant
    migrated_with_rows(url, schema, 30)
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            before, where = _checksums(conn, schema), _node_of(conn, schema)
            to = next(w for w in _workers(conn) if w != where)
            conn.commit()
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("SELECT citus_schema_move(CAST(:s AS regnamespace), :h, :p)"),
                         {"s": f'"{schema}"', "h": to[0], "p": to[1]})
        with engine.connect() as conn:
            assert _node_of(conn, schema) == to
            assert _checksums(conn, schema) == before
    finally:
        engine.dispose()
    db = SessionDB(with_schema(url, schema))
    try:
        new_id = db.append_message("s", "user", "after the move")
        assert db.get_session("s")["message_count"] == 31
        assert new_id in {h["id"] for h in db.search_messages("after")}
        assert len(db.search_messages("数据库", limit=100)) == 30
    finally:
        db.close()


def test_an_existing_tenant_is_distributed_with_every_row(citus_url: str, pg_database: str) -> None:
    """Failure 2 of issue 33: ``citus_schema_distribute`` on a tenant made before it was
    distributed failed (our trigger fired for the rows Citus copied, on the worker,
    before ``state_meta`` was there). ``tenancy.distribute_tenant`` turns the setting
    on and the tenant's triggers off for its one transaction: every row is kept, the
    triggers work again after it; a dry run changes nothing; plain PostgreSQL is told
    that Citus is needed."""
    schema = f"p_{uuid.uuid4().hex[:12]}"
    engine = create_engine(citus_url)
    try:
        with engine.begin() as conn:  # schema-based sharding off: a plain schema of the coordinator
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        migrated_with_rows(citus_url, schema, 12)
        dry = distribute_tenant(citus_url, schema, dry_run=True)
        assert not dry.distributed and dry.rows["messages"] == 12
        placed = distribute_tenant(citus_url, schema)
        assert placed.distributed and not placed.distributed_before and placed.rows == dry.rows
        assert {t[1] for t in placement(citus_url, schema)} == {"schema"}
        assert distribute_tenant(citus_url, schema).distributed_before  # a second call leaves it be
        db = SessionDB(with_schema(citus_url, schema))
        try:
            db.append_message("s", "user", "after 数据库")  # the short-CJK trigger and counters run again
            assert db.get_session("s")["message_count"] == 13
            assert len(db.search_messages("数据库", limit=50)) == 13
        finally:
            db.close()
        with pytest.raises(errors.UnsupportedDatabaseError):
            distribute_tenant(pg_database, "public")
        with pytest.raises(errors.NotFoundError):
            distribute_tenant(citus_url, "no_such_tenant")
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        engine.dispose()


def test_a_store_written_through_a_worker_node(citus_tenant: tuple[str, str]) -> None:
    """Failure 6 of issue 33: a worker hands out ids above 2^48, and the display order
    (a copy of the id) was an ``integer``: every append through a worker failed with
    ``integer out of range``. hs0008 makes it a ``bigint``."""

    url, schema = citus_tenant
    migrations.upgrade(url, schema=schema)
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            host, port = _workers(conn)[0]
    finally:
        engine.dispose()
    worker = make_url(url).set(host=host, port=port)
    db = SessionDB(with_schema(worker, schema))
    try:
        db.create_session("s", "cli")
        first = db.append_message("s", "user", "through a worker 数据库")
        second = db.append_message("s", "assistant", "answered through a worker")
        assert first > 2**31 and second > first
        rows = db.get_messages("s")
        assert [r["id"] for r in rows] == [first, second]
        assert [r["display_order"] for r in rows] == [first, second]
        assert [h["id"] for h in db.search_messages("数据库")] == [first]
    finally:
        db.close()


def test_a_lock_held_on_the_worker_ends_the_write_within_its_budget(citus_tenant: tuple[str, str],
                                                                    monkeypatch: Any) -> None:
    """Failure 5 of issue 33: the lock budget is set on the coordinator, while the wait
    happens on the worker holding the tenant; a write behind an open transaction waited
    for ever. On Citus the write's transaction passes its ``SET LOCAL lock_timeout`` on
    (``citus.propagate_set_commands = 'local'``, local too), so the write gives up with
    DatabaseLockedError when its budget is spent, and nothing of it is written."""


    url, schema = citus_tenant
    migrated_with_rows(url, schema, 1)
    for name in ("WRITE_BUDGET_S", "TRANSCRIPT_BUDGET_S"):  # read at call time
        monkeypatch.setattr(facade, name, 0.5)
    holder = create_engine(url)
    db = SessionDB(with_schema(url, schema))
    outcome: list[BaseException | int] = []
    try:
        with holder.connect() as conn:
            conn.execute(text(f'SELECT id FROM "{schema}".sessions WHERE id = \'s\' FOR UPDATE'))  # held till rollback

            def append() -> None:
                try:
                    outcome.append(db.append_message("s", "user", "behind a held lock"))
                except BaseException as exc:  # the test reads it
                    outcome.append(exc)

            writer = threading.Thread(target=append, daemon=True)
            writer.start()
            writer.join(60)  # without the budget on the worker it waits until the rollback below
            ended_in_time = not writer.is_alive()
            conn.rollback()
        writer.join(60)
        assert ended_in_time, "the write waited past its budget"
        assert len(outcome) == 1 and isinstance(outcome[0], errors.DatabaseLockedError), outcome
        assert db.get_session("s")["message_count"] == 1
        assert len(db.get_messages("s")) == 1
    finally:
        db.close()
        holder.dispose()


#: A writer process of the move test: appends to each tenant in turn until told to stop
#: (a file appears), then prints a JSON line: the ids acknowledged per tenant, and each
#: error that reached it (its type and whether it is one of ours).
_WRITER = r"""
import json, os, sys, time
from hermes_store import SessionDB, errors
from hermes_store.engine import with_schema
url, stop, tag, schemas = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
dbs = {s: SessionDB(with_schema(url, s)) for s in schemas}
acked = {s: [] for s in schemas}
failures = []
n = 0
while not os.path.exists(stop):
    for s, db in dbs.items():
        try:
            acked[s].append(db.append_message(f"w{tag}", "user", f"writer {tag} row {n} 数据库"))
        except Exception as exc:
            failures.append([type(exc).__module__ + "." + type(exc).__name__, isinstance(exc, errors.HermesStoreError),
                             str(exc)[:200]])
    n += 1
for db in dbs.values():
    db.close()
print(json.dumps({"acked": acked, "failures": failures}))
"""


def test_writers_on_two_tenants_while_one_moves_there_and_back(citus_url: str, tmp_path: Any) -> None:
    """2 processes append to 2 tenants while one tenant is moved to the other worker and
    back (``tenancy.move_tenant``, ``force_logical``, as a platform moves a live tenant). Every acknowledged append
    is there afterwards and the counters agree; no error reaches a writer that is not one
    of ours (issue 33, points 4 and 8)."""
    schemas = [f"m_{uuid.uuid4().hex[:10]}" for _ in range(2)]
    engine = create_engine(citus_url)
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("SET citus.enable_schema_based_sharding TO on")
            for schema in schemas:
                conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        for schema in schemas:
            migrations.upgrade(citus_url, schema=schema)
            db = SessionDB(with_schema(citus_url, schema))
            try:
                for tag in ("0", "1"):
                    db.create_session(f"w{tag}", "cli")
            finally:
                db.close()
        stop = tmp_path / "stop"
        writers = [subprocess.Popen([sys.executable, "-c", _WRITER, citus_url, str(stop), tag, *schemas],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for tag in ("0", "1")]
        moved = schemas[0]
        try:
            time.sleep(1.0)
            with engine.connect() as conn:
                home = _node_of(conn, moved)
                other = next(w for w in _workers(conn) if w != home)
                conn.commit()
            for to in (other, home, other):
                done = move_tenant(citus_url, moved, f"{to[0]}:{to[1]}", mode="force_logical")
                assert done.moved and done.nodes_after == [f"{to[0]}:{to[1]}"]
                # What the writers changed meanwhile is named (they may also have been held
                # for the whole move on a loaded machine: then nothing changed).
                assert set(done.changed) <= set(done.before) and done.identical is (not done.changed)
                time.sleep(0.5)
        finally:
            stop.touch()
            outputs = [w.communicate(timeout=120) for w in writers]
        results = []
        for (out, err), writer in zip(outputs, writers, strict=True):
            assert writer.returncode == 0, err[-2000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
        assert [f for r in results for f in r["failures"] if not f[1]] == []  # nothing untyped reached a writer
        with engine.connect() as conn:
            assert _node_of(conn, moved) == other
            for schema in schemas:
                ids = set(conn.execute(text(f'SELECT id FROM "{schema}".messages')).scalars())
                for tag, result in zip(("0", "1"), results, strict=True):
                    acked = result["acked"][schema]
                    assert acked and set(acked) <= ids, (schema, tag)
                    count = conn.execute(text(f'SELECT message_count FROM "{schema}".sessions WHERE id = :s'),
                                         {"s": f"w{tag}"}).scalar()
                    rows = conn.execute(text(f'SELECT count(*) FROM "{schema}".messages WHERE session_id = :s'),
                                        {"s": f"w{tag}"}).scalar()
                    assert count == rows >= len(acked), (schema, tag, count, rows, len(acked))
    finally:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for schema in schemas:
                conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        engine.dispose()


def test_list_tenants_tells_where_each_store_lives(citus_tenant: tuple[str, str], tmp_path: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``tenancy.list_tenants``: every store of the database (a schema with our
    version table), distributed or not, with the worker holding a distributed one, its
    size there, and its sessions and messages; a SQLite file has no tenants."""
    url, distributed = citus_tenant
    migrated_with_rows(url, distributed, 7)
    engine = create_engine(url)
    try:
        with plain_tenant(url, "l", 3) as plain:
            with engine.connect() as conn:
                workers = {f"{h}:{p}" for h, p in _workers(conn)}
            found = {t.schema: t for t in list_tenants(url)}
            monkeypatch.setattr(tenancy, "_COUNTED_PER_STATEMENT", 1)  # a statement per store: the same answer
            ours = {distributed, plain}
            assert {t.schema: t for t in list_tenants(url) if t.schema in ours} == \
                {k: v for k, v in found.items() if k in ours}
            one, two = found[distributed], found[plain]
            assert (one.distributed, one.sessions, one.messages) == (True, 1, 7)
            assert one.node in workers and one.size_bytes is not None and one.size_bytes > 0
            assert (two.distributed, two.node, two.size_bytes, two.sessions, two.messages) == (False, None, None, 1, 3)
            assert one.as_dict()["node"] == one.node
            with pytest.raises(errors.UnsupportedDatabaseError):
                list_tenants(tmp_path / "state.db")
            assert not (tmp_path / "state.db").exists()  # nothing was created
    finally:
        engine.dispose()


# ------------------------------------------------------------------ tenants: move, and the CLI


def _other_worker(url: str, schema: str) -> tuple[str, str]:
    """(where ``schema`` lives, the other worker), each ``host:port``."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            host, port = _node_of(conn, schema)
            home = f"{host}:{port}"
            return home, next(f"{h}:{p}" for h, p in _workers(conn) if f"{h}:{p}" != home)
    finally:
        engine.dispose()


def test_move_tenant_moves_it_whole_and_checks_every_table(citus_tenant: tuple[str, str], pg_url: str) -> None:
    """``tenancy.move_tenant``: a dry run counts and checksums and moves nothing; the move
    puts the tenant whole on the node named, every table identical, and the store works
    there; the same node again is a no-op; bad requests are refused, typed, before
    anything moves (issue 33, point 2)."""
    url, schema = citus_tenant
    migrated_with_rows(url, schema, 20)
    home, other = _other_worker(url, schema)
    dry = move_tenant(url, schema, other, dry_run=True)
    assert (dry.moved, dry.source, dry.target, dry.identical) == (False, [home], other, None)
    assert dry.before["messages"][0] == 20 and _other_worker(url, schema)[0] == home
    moved = move_tenant(url, schema, other)
    assert moved.moved and moved.nodes_after == [other] and moved.identical and moved.changed == []
    assert moved.after == moved.before and set(moved.before) >= {"sessions", "messages", "state_meta"}
    assert _other_worker(url, schema)[0] == other
    assert move_tenant(url, schema, other).moved is False  # already there
    db = SessionDB(with_schema(url, schema))
    try:
        db.append_message("s", "user", "after the move 数据库")
        assert db.get_session("s")["message_count"] == 21
        assert len(db.search_messages("数据库", limit=100)) == 21
    finally:
        db.close()
    with pytest.raises(errors.InvalidInputError, match="no single worker node"):
        move_tenant(url, schema, "nowhere:1")
    with pytest.raises(errors.InvalidInputError, match="transfer mode"):
        move_tenant(url, schema, home, mode="teleport")
    with pytest.raises(errors.NotFoundError):
        move_tenant(url, "no_such_tenant", home)
    with pytest.raises(errors.UnsupportedDatabaseError, match="needs Citus"):
        move_tenant(pg_url, "public", home)
    assert _other_worker(url, schema)[0] == other


def test_the_tenants_commands_list_distribute_and_move(citus_tenant: tuple[str, str], pg_url: str,
                                                        tmp_path: Any) -> None:
    """``hermes-store tenants list|distribute|move``, with ``--json`` and ``--dry-run``,
    on the cluster; plain PostgreSQL and a file are told what is needed."""
    url, distributed = citus_tenant
    migrated_with_rows(url, distributed, 5)
    engine = create_engine(url)
    try:
        with plain_tenant(url, "c", 4) as plain:
            listed = {t["schema"]: t for t in ok("--json", "tenants", "list", "--url", url).json()["tenants"]}
            assert listed[distributed]["distributed"] and listed[distributed]["messages"] == 5
            assert (listed[plain]["distributed"], listed[plain]["node"], listed[plain]["messages"]) == (False, None, 4)
            human = ok("tenants", "list", "--url", url).stdout
            assert distributed in human and plain in human and listed[distributed]["node"] in human

            dry = ok("--json", "tenants", "distribute", plain, "--dry-run", "--url", url).json()
            assert (dry["distributed"], dry["dry_run"], dry["rows"]["messages"]) == (False, True, 4)
            assert "Distributed " + plain in ok("tenants", "distribute", plain, "--url", url).stdout
            assert ok("--json", "tenants", "list", "--url", url).json()["tenants"] and \
                {t["schema"]: t for t in ok("--json", "tenants", "list", "--url", url).json()["tenants"]}[plain][
                    "distributed"]

            home, other = _other_worker(url, distributed)
            with engine.connect() as conn:
                node_id = conn.execute(text("SELECT nodeid FROM pg_dist_node WHERE nodename || ':' || nodeport = :n"),
                                       {"n": other}).scalar()
            dry_move = ok("--json", "tenants", "move", distributed, "--to", other, "--dry-run", "--url", url).json()
            assert (dry_move["moved"], dry_move["from"], dry_move["to"]) == (False, [home], other)
            assert _other_worker(url, distributed)[0] == home
            moved = ok("--json", "tenants", "move", distributed, "--to", str(node_id), "--url", url).json()
            assert (moved["moved"], moved["nodes_after"], moved["identical"]) == (True, [other], True)
            assert moved["tables"]["messages"]["rows_after"] == 5
            text_back = ok("tenants", "move", distributed, "--to", home, "--mode", "block_writes", "--url", url).stdout
            assert "Moved " + distributed in text_back and "identical" in text_back
            assert _other_worker(url, distributed)[0] == home

            line = one_line_error(run("tenants", "move", distributed, "--to", "nowhere:1", "--url", url), 1)
            assert "no single worker node" in line and home in line
            assert "needs Citus" in one_line_error(run("tenants", "distribute", "public", "--url", pg_url), 1)
            assert "--url" in one_line_error(run("tenants", "list", "--db", str(tmp_path / "state.db")), 1)
            assert not (tmp_path / "state.db").exists()
            assert run("tenants", "move", distributed, "--url", url).code == 2  # --to is required
    finally:
        engine.dispose()


_MOVER = """
import sys
from hermes_store.tenancy import move_tenant
move_tenant(sys.argv[1], sys.argv[2], sys.argv[3], mode="force_logical")
"""


def _move_backend(engine: Any, mover: str) -> int | None:
    """The server backend running the move of the process named ``mover`` (its
    application_name: other tests move other tenants at the same time)."""
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE 'SELECT citus_schema_move(%' AND state = 'active'"
            " AND application_name = :a"), {"a": mover}).scalar()


@pytest.mark.parametrize("how", ["client SIGKILLed", "server backend terminated"])
@pytest.mark.parametrize("after", [0.05, 0.6, 1.5])
def test_a_killed_move_leaves_the_tenant_whole_on_one_node(citus_tenant: tuple[str, str], how: str,
                                                           after: float) -> None:
    """A move cut off part way (its process SIGKILLed, or the server backend running it
    terminated, at several points of Citus' steps) leaves the tenant whole on one node:
    every table there, every row and checksum as before; the store works; and the next
    move (which clears what the cut one left behind) succeeds (issue 33, point 4)."""
    url, schema = citus_tenant
    migrated_with_rows(url, schema, 400)
    home, other = _other_worker(url, schema)
    before = move_tenant(url, schema, home).before  # already home: reads, moves nothing
    engine = create_engine(url)
    try:
        name = f"mover_{uuid.uuid4().hex[:8]}"
        mover_url = make_url(url).update_query_dict({"application_name": name}).render_as_string(hide_password=False)
        mover = subprocess.Popen([sys.executable, "-c", _MOVER, mover_url, schema, other],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline, pid = time.monotonic() + 30, None
        while pid is None and mover.poll() is None and time.monotonic() < deadline:
            pid = _move_backend(engine, name)
            time.sleep(0.01)
        assert pid is not None, mover.communicate()
        time.sleep(after)
        if how == "client SIGKILLed":
            os.kill(mover.pid, signal.SIGKILL)
        else:
            with engine.connect() as conn:
                conn.execute(text("SELECT pg_terminate_backend(CAST(:p AS integer))"), {"p": pid})
        mover.communicate(timeout=60)
        deadline = time.monotonic() + 60
        while _move_backend(engine, name) is not None and time.monotonic() < deadline:
            time.sleep(0.1)  # a client gone leaves its backend to end the statement
        with engine.connect() as conn:
            where = pg_citus.schema_nodes(conn, schema)
        assert len(where) == 1 and where[0] in (home, other), where
        if how != "client SIGKILLed" and after < 0.1:
            # Cut before Citus could have switched the tenant over. (A client's death cuts
            # the move only once its backend notices: it may also finish it.)
            assert where == [home]
        again = move_tenant(url, schema, where[0])
        assert again.before == before and again.moved is False
        db = SessionDB(with_schema(url, schema))
        try:
            db.append_message("s", "user", "after the cut move 数据库")
            assert db.get_session("s")["message_count"] == 401
        finally:
            db.close()
        last = move_tenant(url, schema, home if where[0] == other else other)
        assert last.moved and last.identical and len(last.nodes_after) == 1
    finally:
        engine.dispose()


def test_a_tenant_created_by_our_migration_is_distributed_where_the_host_turned_sharding_on(
        citus_url: str) -> None:
    """README's way: schema-based sharding on for the host's connections (here through
    libpq's ``options``; ``ALTER DATABASE … SET`` in production), and our migration,
    which creates the tenant's schema, makes a distributed schema: Citus places it."""
    schema = f"h_{uuid.uuid4().hex[:12]}"
    host_url = make_url(citus_url).update_query_dict({"options": "-c citus.enable_schema_based_sharding=on"})
    engine = create_engine(citus_url)
    try:
        migrations.upgrade(host_url.render_as_string(hide_password=False), schema=schema)
        with engine.connect() as conn:
            assert pg_citus.is_distributed(conn, schema) and len(pg_citus.schema_nodes(conn, schema)) == 1
        assert {t[1] for t in placement(citus_url, schema)} == {"schema"}
        assert [t.messages for t in list_tenants(citus_url) if t.schema == schema] == [0]
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        engine.dispose()


def test_a_move_over_a_leftover_still_in_use_waits_for_it_then_gives_up_typed(
        citus_tenant: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """After a move Citus drops the tenant's old copy later; while something on that
    worker still holds it (a reader of the old placement, a cut-off move's backend
    ending), a move back is refused by Citus with an untyped internal error. Here a
    direct connection to the old worker holds a lock on it: the move back waits for it
    (tries again) and gives up typed past its budget, the tenant whole where it was;
    once the lock is let go, the move succeeds (issue 33, point 2)."""
    url, schema = citus_tenant
    migrated_with_rows(url, schema, 10)
    home, other = _other_worker(url, schema)
    engine = create_engine(url)
    with engine.connect() as conn:
        shard = conn.execute(text("SELECT shard_name FROM citus_shards WHERE table_name = CAST(:t AS regclass)"),
                             {"t": f'"{schema}".sessions'}).scalar()
    host, port = home.rsplit(":", 1)
    worker = create_engine(make_url(url).set(host=host, port=int(port)))
    holder = worker.connect()
    try:
        # A reader of the old copy, in an open transaction: it holds the copy's ACCESS SHARE lock.
        holder.exec_driver_sql(f'SELECT count(*) FROM "{schema}"."{shard.split(".", 1)[1]}"')
        assert move_tenant(url, schema, other).moved  # the old copy stays, held
        monkeypatch.setattr(tenancy, "MOVE_LEFTOVER_BUDGET_S", 3.0)
        with pytest.raises(errors.TenantPlacementError, match="try again later"):
            move_tenant(url, schema, home)
        with engine.connect() as conn:
            assert pg_citus.schema_nodes(conn, schema) == [other]
        monkeypatch.setattr(tenancy, "MOVE_LEFTOVER_BUDGET_S", 60.0)
        released = threading.Event()

        def release() -> None:
            time.sleep(2.0)
            holder.rollback()
            released.set()

        threading.Thread(target=release, daemon=True).start()
        back = move_tenant(url, schema, home)
        assert released.is_set()  # it could only succeed once the lock was let go
        assert back.moved and back.identical and back.nodes_after == [home]
    finally:
        holder.close()
        worker.dispose()
        engine.dispose()
