"""``hermes-store copy`` / :func:`hermes_store.copying.copy_history`: a whole history moved
between SQLite files and PostgreSQL databases, in every direction.

What is shown here: every row of every copied table arrives exactly (ids, NULLs, NULs,
bytes, 17-digit floats), per-file bookkeeping stays behind, searches give the same
hits on both sides, the source is never written (file bytes and ``-wal`` hashed, a
server's rows compared), a destination holding data is refused unless ``--merge``
(then clashes go as ``import`` handles them), a second run changes nothing, a copy
killed with SIGKILL at many points (between and inside transactions) finishes exactly
when run again, an unadopted Hermes file is read through an adopted work copy, and bad
arguments are typed errors that create nothing.

Tests that take ``backend`` run once per backend; copies name their direction. The
Citus cases (``citus``) copy into a tenant in a distributed schema of its own on the
Citus test cluster (conftest ``citus_schemas``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import make_url

from hermes_store import SessionDB, adopt, errors, migrations
from hermes_store.copying import MARKER_KEY, CopyError, CopyInProgressError, CopyVerificationError, DestinationNotEmptyError, copy_history
from hermes_store.copying.destination import destination_lock
from hermes_store.copying.endpoints import endpoint
from hermes_store.models import Base
from hermes_store.dialects import cjk_bigram as bigram_upkeep

from .helpers import HERMES_DBS, in_schema
from .test_cli import file_target, one_line_error, run, server_target, snapshot
from .test_hermes_opens_ours import hermes_columns, hermes_open
from .test_maintenance import FTS, _fill_exacting, extra_pg_database, stored

pytestmark = [pytest.mark.both_backends, pytest.mark.on_citus]

T = Base.metadata.tables
M = T["messages"]
#: What a copy carries (state_meta is compared key by key).
COPIED = ("sessions", "messages", "session_model_usage", "system_prompts", "gateway_routing",
          "gateway_hygiene_state", "conversation_generations", "async_delegations")
#: Leases and heartbeats of processes running against the source: left behind.
LEFT_BEHIND = ("compression_locks", "session_turn_leases", "gateway_heartbeats")
#: state_meta keys that describe the source file itself: left behind.
#: What a store's short-CJK upkeep notes about its own writers (never copied either).
SETTLE_KEY = bigram_upkeep.SETTLE_KEY
PER_FILE_KEYS = ("last_auto_prune", "fts_rebuild_high_water", "fts_rebuild_progress", "hermes_store.cjk_bigram_high_water")
QUERIES = ("pelicans", "flamingo", "kubernetes", "rollout", "数据库", "数据")
LONG = 9  # messages of the session larger than a batch (tests copy with batch=3)

DIRECTIONS = [
    pytest.param(("sqlite", "sqlite"), id="sqlite-to-sqlite"),
    pytest.param(("sqlite", "postgresql"), id="sqlite-to-postgresql"),
    pytest.param(("postgresql", "sqlite"), id="postgresql-to-sqlite"),
    pytest.param(("postgresql", "postgresql"), id="postgresql-to-postgresql"),
    pytest.param(("sqlite", "citus"), id="sqlite-to-citus"),
    pytest.param(("postgresql", "citus"), id="postgresql-to-citus"),
]


# ---------------------------------------------------------------------- helpers


@pytest.fixture
def place(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[[str, str], Any]]:
    """``place(kind, name)``: somewhere empty of that kind, a file path (not created), a
    fresh database on the test server, or (``citus``) a fresh distributed schema on the
    Citus cluster (dropped afterwards)."""
    with ExitStack() as stack:

        def make(kind: str, name: str) -> Any:
            if kind == "sqlite":
                return tmp_path / f"{name}.db"
            if kind == "citus":
                return in_schema(request.getfixturevalue("citus_url"), request.getfixturevalue("citus_schemas")())
            return stack.enter_context(extra_pg_database(request.getfixturevalue("pg_url")))

        yield make


def fill(db: SessionDB) -> None:
    """A history with everything a copy must keep, and things it must leave behind."""
    _fill_exacting(db)  # NULs, odd JSON, 17-digit floats, big counters, a hashed prompt, usage rows
    db.set_session_title("root", "root title")
    db.create_session("z-parent", "cli", model="m1")
    db.append_message("z-parent", "user", "parent talks about the kubernetes rollout")
    db.end_session("z-parent", "compression")
    # Its id sorts before its parent's: copied first, linked when the parent arrives.
    db.create_session("a-child", "cli", parent_session_id="z-parent")
    db.append_message("a-child", "assistant", "child continues the kubernetes rollout 数据库迁移")
    db.create_session("long", "telegram")  # more messages than a batch: streamed on its own
    for i in range(LONG):
        db.append_message("long", ("user", "assistant")[i % 2], f"long talk {i} about 数据 and pelicans")

    def extras(conn: Any) -> None:
        ids = [r[0] for r in conn.execute(select(M.c.id).where(M.c.session_id == "long").order_by(M.c.id))]
        conn.execute(delete(M).where(M.c.id == ids[4]))  # a hole in the ids
        # Hermes' pending backfill and an unset flag: NULLs the insert path would fill in.
        conn.execute(update(M).where(M.c.id.in_(ids[:2])).values(display_order=None, observed=None))
        conn.execute(update(M).where(M.c.id == ids[2]).values(display_identity=b"\x00\xff\x10id"))
        conn.execute(insert(T["gateway_routing"]), [
            {"scope": "", "session_key": "tg:1", "entry_json": '{"session_id": "kid"}', "updated_at": 1.5},
            {"scope": "ops", "session_key": "tg:1", "entry_json": "{}", "updated_at": 2.000000000000001},
        ])
        conn.execute(insert(T["gateway_hygiene_state"]), [{"session_key": "tg:1", "failure_streak": 3}])
        conn.execute(insert(T["conversation_generations"]), [
            {"source": "telegram", "session_key": "tg:1", "generation": 7},
            {"source": "discord", "session_key": "d:9", "generation": 2},
        ])
        conn.execute(insert(T["async_delegations"]), [
            {"delegation_id": "d1", "origin_session": "root", "state": "done", "dispatched_at": 1.0,
             "updated_at": 2.0, "result_json": '{"ok": true, "text": "a\\u0000b"}', "owner_pid": 42},
        ])
        conn.execute(insert(T["compression_locks"]), [
            {"session_id": "root", "holder": "pid 1", "acquired_at": 1.0, "expires_at": 9e9}])
        conn.execute(insert(T["session_turn_leases"]), [
            {"conversation_id": "c", "holder": "pid 1", "acquired_at": 1.0, "expires_at": 9e9}])
        conn.execute(insert(T["gateway_heartbeats"]), [
            {"backend_id": "gw", "pid": 1, "started_at": 1.0, "last_heartbeat": 2.0}])

    db._write(extras)
    db.set_meta("hermes.some_setting", "kept\x00as is")
    db.set_meta("last_auto_prune", "1700000000.0")
    # A pending FTS rebuild window of the source: copied, it would stop the destination's
    # triggers from indexing every message inside it.
    db.set_meta("fts_rebuild_high_water", "1000000")
    db.set_meta("fts_rebuild_progress", "0")


def server_kind(kind: str) -> str:
    """The backend a kind of place is: a Citus tenant is a PostgreSQL store."""
    return "postgresql" if kind == "citus" else kind


def rows(db: SessionDB, table: str) -> list[dict[str, Any]]:
    """A table's rows, in an order both backends agree on (their text collations differ)."""
    return sorted(stored(db, table), key=lambda r: repr(sorted(r.items())))


def contents(db: SessionDB) -> dict[str, Any]:
    """Every copied table, and the state_meta keys that travel (marker left out)."""
    out: dict[str, Any] = {t: rows(db, t) for t in COPIED}
    out["state_meta"] = {r["key"]: r["value"] for r in stored(db, "state_meta")
                         if r["key"] not in PER_FILE_KEYS and r["key"] not in (MARKER_KEY, SETTLE_KEY)}
    return out


def everything(db: SessionDB) -> dict[str, Any]:
    """Every table of the models, state_meta whole: what "changes nothing" compares."""
    return {t: rows(db, t) for t in T if t not in ("messages_cjk_bigram",)}


def hits(db: SessionDB) -> dict[str, list[tuple[Any, ...]]]:
    return {q: sorted((h["session_id"], h["id"], h["role"]) for h in db.search_messages(q, limit=100)) for q in QUERIES}


def sha(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def file_state(path: Path) -> tuple[str | None, str | None]:
    """Hashes of a database file and its write-ahead log (None: no such file)."""
    return sha(path), sha(Path(f"{path}-wal"))


def filled(kind: str, place: Callable[[str, str], Any], name: str = "src") -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """A source of ``kind`` with :func:`fill`'s history, its contents and search hits."""
    where = place(kind, name)
    with SessionDB(where) as db:
        fill(db)
        return where, contents(db), hits(db)


# ---------------------------------------------------------------------- every direction


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_a_copy_keeps_every_row_of_every_table(direction: tuple[str, str], place: Callable[[str, str], Any]) -> None:
    src, want, want_hits = filled(direction[0], place)
    dst = place(direction[1], "dst")
    seen: list[str] = []
    report = copy_history(src, dst, batch=3, progress=lambda stage, done, total: seen.append(stage))
    assert report.ok and report.verified and not report.resumed and not report.already_complete
    assert (report.sessions_copied, report.sessions_present) == (7, 0)
    assert report.messages_copied == len(want["messages"])
    assert report.tables["messages"] == {"source": len(want["messages"]), "destination": len(want["messages"])}
    assert report.source_checksum == report.destination_checksum and report.sessions_checked == 7
    assert report.renumbered_sessions == [] and report.dropped_links == [] and report.mismatched_sessions == []
    assert sorted(report.skipped_meta_keys) == sorted(PER_FILE_KEYS)
    assert set(report.skipped_tables) == set(LEFT_BEHIND)
    assert {"sessions", "verify"} <= set(seen)

    with SessionDB(dst) as db:
        assert contents(db) == want  # ids, NULLs, NULs, bytes, floats, links, ledgers, prompts
        for table in LEFT_BEHIND:
            assert stored(db, table) == []
        meta = {r["key"]: r["value"] for r in stored(db, "state_meta")}
        assert "last_auto_prune" not in meta and "fts_rebuild_high_water" not in meta
        assert json.loads(meta[MARKER_KEY])["state"] == "done"
        assert hits(db) == want_hits and all(want_hits[q] for q in QUERIES)
        assert db.check_fts() == {name: None for name in FTS[server_kind(direction[1])]}
        assert db.get_session_lineage("a-child") == ["z-parent", "a-child"]
        assert [m["content"] for m in db.get_messages("long")][:2] == ["long talk 0 about 数据 and pelicans",
                                                                     "long talk 1 about 数据 and pelicans"]
        # New messages continue after the copied ids (PostgreSQL's identity was moved past them).
        top = max(r["id"] for r in want["messages"])
        assert db.append_message("solo", "user", "after the copy") > top
    assert migrations.current(dst) == migrations.head()


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_ids_the_source_handed_out_are_never_handed_out_again(direction: tuple[str, str],
                                                              place: Callable[[str, str], Any]) -> None:
    """The source's newest messages were deleted: their ids stay retired in the copy,
    as in the source (AUTOINCREMENT's sqlite_sequence, PostgreSQL's identity)."""
    src = place(direction[0], "src")
    with SessionDB(src) as db:
        db.create_session("s", "cli")
        kept = db.append_message("s", "user", "kept")
        newest = [db.append_message("s", "user", f"deleted {i}") for i in range(3)]
        db._write(lambda conn: conn.execute(delete(M).where(M.c.id.in_(newest))))
        retired = db.append_message("s", "user", "probe")  # what the source itself hands out next
        db._write(lambda conn: conn.execute(delete(M).where(M.c.id == retired)))
    assert retired > max(newest) > kept
    dst = place(direction[1], "dst")
    assert copy_history(src, dst).ok
    with SessionDB(dst) as db:
        assert [m["id"] for m in db.get_messages("s")] == [kept]
        assert db.append_message("s", "user", "after the copy") > retired


def test_hermes_opens_a_file_copied_from_a_server(place: Callable[[str, str], Any]) -> None:
    """The way back: a server's history as a state.db that Hermes v23 (and v30) opens and reads."""
    src, want, _hits = filled("postgresql", place)
    for version in ("23", "30"):
        dst = place("sqlite", f"back-{version}")
        copy_history(src, dst)
        conn = hermes_open(dst, version)
        cols = hermes_columns(version)
        got = conn.execute(f"SELECT {', '.join(cols['messages'])} FROM messages ORDER BY id").fetchall()
        sent = sorted(want["messages"], key=lambda m: m["id"])
        assert [(m["id"], m["content"]) for m in got] == [(m["id"], m["content"]) for m in sent]
        assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == 7
        conn.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES ('integrity-check', 1)")
        conn.close()


# ---------------------------------------------------------------------- the source is only read


@pytest.mark.parametrize("dst_kind", ["sqlite", "postgresql"])
def test_a_source_file_is_never_written(dst_kind: str, place: Callable[[str, str], Any], tmp_path: Path) -> None:
    src = tmp_path / "src.db"
    live = SessionDB(src)
    fill(live)
    live.append_message("solo", "user", "only in the write-ahead log so far")
    # Hermes still running: the file has a WAL the copy must read through, untouched.
    before = file_state(src)
    assert before[1] is not None
    dst = place(dst_kind, "dst")
    try:
        report = copy_history(src, dst, batch=4)
        assert file_state(src) == before
    finally:
        live.close()
    assert report.ok
    with SessionDB(dst) as db:
        assert [m["content"] for m in db.get_messages("solo")] == ["only in the write-ahead log so far"]

    # Closed (no WAL): the reader's sidecars are cleaned up, the bytes and mtime unchanged.
    before, mtime = file_state(src), src.stat().st_mtime_ns
    assert before[1] is None
    again = copy_history(src, place(dst_kind, "dst2"))
    assert again.ok and file_state(src) == before and src.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("src.db")) == ["src.db"]


def test_a_server_source_is_never_written(place: Callable[[str, str], Any]) -> None:
    src, _want, _hits = filled("postgresql", place)
    with SessionDB(src) as db:
        before = everything(db)
    report = copy_history(src, place("sqlite", "dst"))
    assert report.ok
    with SessionDB(src) as db:
        assert everything(db) == before  # no marker, no index catch-up, nothing


# ---------------------------------------------------------------------- refusal and merge


def test_a_destination_holding_data_is_refused_untouched(backend: str, place: Callable[[str, str], Any]) -> None:
    src, _want, _hits = filled("sqlite", place)
    dst = place(backend, "dst")
    with SessionDB(dst) as db:
        db.create_session("theirs", "cli")
        db.append_message("theirs", "user", "mine, not yours")
    with SessionDB(dst) as db:  # (an open catches the short-CJK index up: that is SessionDB's write)
        before = everything(db)
    hashed = file_state(dst) if backend == "sqlite" else None
    with pytest.raises(DestinationNotEmptyError, match="--merge"):
        copy_history(src, dst)
    if hashed is not None:
        assert file_state(dst) == hashed
    with SessionDB(dst) as db:
        assert everything(db) == before
    line = one_line_error(run("copy", "--from", src, "--to", dst), 1)
    assert "already holds data (1 sessions, 1 messages" in line and "--merge" in line
    with SessionDB(dst) as db:
        assert everything(db) == before


def test_merge_keeps_what_is_there_and_handles_clashes_as_import(backend: str, place: Callable[[str, str], Any]) -> None:
    src, want, _hits = filled(backend, place)
    dst = place(backend, "dst")
    with SessionDB(dst) as db:
        db.create_session("kid", "discord", model="theirs")  # the same id: kept as it is
        db.append_message("kid", "user", "their kid")
        db.create_session("mine", "cli")
        db.set_session_title("mine", "root title")  # the source's root has this title
        for i in range(len(want["messages"]) + 5):  # every source message id is taken
            db.append_message("mine", "user", f"their message {i}")
        db.set_meta("hermes.some_setting", "theirs")

        def theirs(conn: Any) -> None:
            conn.execute(insert(T["conversation_generations"]), [
                {"source": "telegram", "session_key": "tg:1", "generation": 9},  # ahead: stays 9
                {"source": "discord", "session_key": "d:9", "generation": 1},  # behind: becomes 2
            ])

        db._write(theirs)
        mine_before = [r for r in rows(db, "messages") if r["session_id"] == "mine"]
        kid_before = db.export_session("kid")

    report = copy_history(src, dst, merge=True, batch=3)
    assert report.ok and report.merge
    assert (report.sessions_copied, report.sessions_present) == (6, 1)
    assert report.kept_sessions == ["kid"]
    assert sorted(report.renumbered_sessions) == ["a-child", "exact", "long", "root", "z-parent"]  # solo has none
    assert report.renamed_titles == [("root", "root title", "root title #2")]
    with SessionDB(dst) as db:
        assert db.export_session("kid") == kid_before
        assert [r for r in rows(db, "messages") if r["session_id"] == "mine"] == mine_before
        def strip(ms: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [{k: v for k, v in m.items() if k not in ("id", "display_order")} for m in ms]

        for sid in ("root", "exact", "long", "a-child", "z-parent"):
            ours = [m for m in want["messages"] if m["session_id"] == sid]
            got = [m for m in stored(db, "messages") if m["session_id"] == sid]
            assert strip(got) == strip(sorted(ours, key=lambda m: m["id"])), sid
        assert db.get_session("root")["title"] == "root title #2"
        assert db.get_session_lineage("a-child") == ["z-parent", "a-child"]
        generations = {(r["source"], r["session_key"]): r["generation"] for r in stored(db, "conversation_generations")}
        assert generations == {("telegram", "tg:1"): 9, ("discord", "d:9"): 2}
        assert db.get_meta("hermes.some_setting") == "theirs"
        assert sorted(h["session_id"] for h in db.search_messages("pelicans")) == ["long"] * (LONG - 1) + ["root"]
        after = everything(db)
    again = copy_history(src, dst, merge=True, batch=3)
    assert again.ok and again.already_complete and again.sessions_copied == 0
    with SessionDB(dst) as db:
        assert everything(db) == after


# ---------------------------------------------------------------------- idempotence, verification


def test_a_second_copy_changes_nothing(backend: str, place: Callable[[str, str], Any]) -> None:
    src, _want, _hits = filled("sqlite", place)
    dst = place(backend, "dst")
    first = copy_history(src, dst, batch=5)
    with SessionDB(dst) as db:
        after = everything(db)
    second = copy_history(src, dst, batch=5)
    assert second.ok and second.already_complete and not second.resumed
    assert (second.sessions_copied, second.messages_copied, second.sessions_present) == (0, 0, 7)
    assert second.source_checksum == first.source_checksum == second.destination_checksum
    with SessionDB(dst) as db:
        assert everything(db) == after  # the marker row included


def test_a_destination_that_drifted_fails_verification_naming_the_session(backend: str,
                                                                            place: Callable[[str, str], Any]) -> None:
    src, _want, _hits = filled("sqlite", place)
    dst = place(backend, "dst")
    copy_history(src, dst)

    routing = T["gateway_routing"]

    def tamper(conn: Any) -> None:
        conn.execute(update(M).where(M.c.session_id == "kid").values(content="edited after the copy"))
        conn.execute(update(routing).where(routing.c.scope == "ops").values(entry_json='{"edited": 1}'))
        conn.execute(delete(routing).where(routing.c.scope == ""))  # a gap: filled in again

    with SessionDB(dst) as db:
        db._write(tamper)
    with pytest.raises(CopyVerificationError, match="'kid'") as caught:
        copy_history(src, dst)
    report = caught.value.report
    assert report.mismatched_sessions == ["kid"] and report.mismatched_rows == {"gateway_routing": 1}
    assert report.source_checksum != report.destination_checksum
    with SessionDB(dst) as db:
        assert sorted(r["scope"] for r in stored(db, "gateway_routing")) == ["", "ops"]
    result = run("--json", "copy", "--from", src, "--to", dst)
    assert result.code == 1 and "'kid'" in one_line_error(result, 1)
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and doc["mismatched_sessions"] == ["kid"]


# ---------------------------------------------------------------------- killed and resumed

KILLER = r"""
import json, os, signal, sys
from hermes_store import copying as copier
from hermes_store.repositories.messages import MessageRepository

src, dst, batch, kind, arg, nth = json.loads(sys.argv[1])
calls = {"n": 0}

def hit():
    calls["n"] += 1
    if calls["n"] == nth:
        os.kill(os.getpid(), signal.SIGKILL)

def progress(stage, done, total):
    if kind == "progress" and stage == arg:
        hit()

def wrap(owner, name):
    real = getattr(owner, name)
    def inner(*a, **k):
        out = real(*a, **k)  # written, not committed: the kill lands inside the transaction
        hit()
        return out
    setattr(owner, name, inner)

if kind == "insert":
    wrap(MessageRepository, "insert_rows")
elif kind == "marker":
    wrap(copier.Copier, "_store_marker")
copier.copy_history(src, dst, batch=batch, progress=progress)
print("finished without being killed")
"""

KILL_POINTS = [
    pytest.param(("progress", "system_prompts", 1), id="after-prompts"),
    pytest.param(("progress", "sessions", 1), id="after-first-batch"),
    pytest.param(("progress", "sessions", 4), id="mid-sessions"),
    pytest.param(("insert", None, 2), id="inside-a-message-insert"),
    pytest.param(("insert", None, 5), id="inside-the-long-session"),
    pytest.param(("marker", None, 3), id="inside-a-marker-write"),
    pytest.param(("progress", "gateway_routing", 1), id="mid-tables"),
    pytest.param(("progress", "index", 1), id="after-indexing"),
    pytest.param(("progress", "verify", 1), id="before-the-done-marker"),
]


def kill_copy(src: Any, dst: Any, batch: int, point: tuple[Any, ...]) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                         os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", KILLER, json.dumps([str(src), str(dst), batch, *point])],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stdout, done.stderr)


@pytest.mark.parametrize("point", KILL_POINTS)
@pytest.mark.parametrize("direction", [DIRECTIONS[1], DIRECTIONS[2]])
def test_a_copy_killed_anywhere_resumes_to_the_exact_result(direction: tuple[str, str], point: tuple[Any, ...],
                                                            place: Callable[[str, str], Any]) -> None:
    src, want, want_hits = filled(direction[0], place)
    dst = place(direction[1], "dst")
    source_file = file_state(src) if direction[0] == "sqlite" else None
    kill_copy(src, dst, 2, point)
    if source_file is not None:
        assert file_state(src)[0] == source_file[0]
    report = copy_history(src, dst, batch=2)
    assert report.ok and report.mismatched_sessions == []
    assert report.resumed and not report.already_complete  # every kill point is after a commit
    assert report.sessions_copied + report.sessions_present == 7
    with SessionDB(dst) as db:
        assert contents(db) == want
        assert hits(db) == want_hits
        assert db.check_fts() == {name: None for name in FTS[server_kind(direction[1])]}
        after = everything(db)
    again = copy_history(src, dst, batch=2)
    assert again.already_complete and again.sessions_copied == 0
    with SessionDB(dst) as db:
        assert everything(db) == after
        assert db.append_message("solo", "user", "after the copy") > max(m["id"] for m in want["messages"])


def test_a_killed_copy_is_finished_by_the_command_line(place: Callable[[str, str], Any]) -> None:
    src, want, _hits = filled("sqlite", place)
    dst = place("sqlite", "dst")
    kill_copy(src, dst, 2, ("progress", "sessions", 3))
    doc = run("--json", "copy", "--from", src, "--to", dst, "--batch", "2")
    assert doc.code == 0, doc.stderr
    summary = json.loads(doc.stdout)
    assert summary["ok"] and summary["resumed"] and summary["sessions_present"] > 0
    with SessionDB(dst) as db:
        assert contents(db) == want


def test_a_failed_merge_copy_into_a_server_resumes(place: Callable[[str, str], Any]) -> None:
    """A merge run that stopped after committing kept ids (above the destination's
    counter) resumes: the first renumbered session of the next run syncs the counter
    first instead of colliding with those ids."""
    dst = place("postgresql", "dst")
    with SessionDB(dst) as db:
        db.create_session("d", "cli")
        for i in range(3):
            db.append_message("d", "user", f"there before {i}")  # ids 1-3
    src = place("sqlite", "src")
    with SessionDB(src) as db:
        db.create_session("c", "cli")
        for i in range(3):
            db.append_message("c", "user", f"clashing id {i}")  # ids 1-3: taken, renumbered
        db.create_session("b", "cli")
        for i in range(7):
            db.append_message("b", "user", f"free id {i}")  # ids 4-10: kept
        want = {sid: [m["content"] for m in db.get_messages(sid)] for sid in ("b", "c")}

    def stop_after_first_batch(stage: str, done: int, total: Any) -> None:
        if stage == "sessions" and done >= 1:
            raise RuntimeError("stopped")

    with pytest.raises(RuntimeError, match="stopped"):
        copy_history(src, dst, merge=True, batch=1, progress=stop_after_first_batch)
    report = copy_history(src, dst, merge=True, batch=1)
    assert report.ok and report.resumed and "c" in report.renumbered_sessions
    with SessionDB(dst) as db:
        assert {sid: [m["content"] for m in db.get_messages(sid)] for sid in ("b", "c")} == want
        assert [m["id"] for m in db.get_messages("b")] == list(range(4, 11))
        assert min(m["id"] for m in db.get_messages("c")) > 10
        assert len(db.get_messages("d")) == 3


def test_a_server_source_read_by_a_role_without_sequence_rights(place: Callable[[str, str], Any],
                                                                tmp_path: Path, pg_url: str) -> None:
    """A reporting role with SELECT on the tables only (no rights on the identity's
    sequence) can be the source: the id high-water mark falls back to the largest id."""
    from sqlalchemy import create_engine as sa_create_engine

    src = place("postgresql", "src")
    with SessionDB(src) as db:
        db.create_session("s", "cli")
        ids = [db.append_message("s", "user", f"row {i}") for i in range(3)]
    role = f"hs_reader_{os.getpid()}"
    admin = sa_create_engine(src, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
            conn.exec_driver_sql(f"GRANT USAGE ON SCHEMA public TO {role}")
            conn.exec_driver_sql(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
        reader = make_url(src).set(username=role, password=None).render_as_string(hide_password=False)
        report = copy_history(reader, tmp_path / "out.db")
        assert report.ok and report.messages_copied == 3
        with SessionDB(tmp_path / "out.db") as db:
            assert [m["id"] for m in db.get_messages("s")] == ids
            assert db.append_message("s", "user", "next") > max(ids)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP OWNED BY {role}")
            conn.exec_driver_sql(f"DROP ROLE IF EXISTS {role}")
        admin.dispose()


# ---------------------------------------------------------------------- two copies into one destination

PAUSER = r"""
import json, sys, time
from pathlib import Path
from hermes_store import copying as copier

src, dst, flag, go = json.loads(sys.argv[1])

def progress(stage, done, total):
    if stage == "sessions" and not Path(flag).exists():
        Path(flag).write_text("paused")  # after its first committed batch, holding the destination
        while not Path(go).exists():
            time.sleep(0.02)

copier.copy_history(src, dst, batch=2, progress=progress)
print("finished")
"""


@pytest.mark.parametrize("direction", [DIRECTIONS[1], DIRECTIONS[2], DIRECTIONS[4]])
def test_a_second_copy_into_a_busy_destination_is_refused_and_writes_nothing(
        direction: tuple[str, str], place: Callable[[str, str], Any], tmp_path: Path) -> None:
    """Two copies into one store would each decide from a state the other is changing:
    the second is refused at once (CopyInProgressError), then the first finishes exactly."""
    src, want, _hits = filled(direction[0], place)
    other, _other_want, _h = filled(direction[0], place, "other")
    dst = place(direction[1], "dst")
    flag, go = tmp_path / "paused", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                         os.environ.get("PYTHONPATH", "")])}
    first = subprocess.Popen([sys.executable, "-c", PAUSER, json.dumps([str(src), str(dst), str(flag), str(go)])],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        for _ in range(3000):
            if flag.exists() or first.poll() is not None:
                break
            time.sleep(0.02)
        assert flag.exists(), first.communicate(timeout=5)
        with SessionDB(dst) as db:
            during = everything(db)
        before = file_state(dst) if direction[1] == "sqlite" else None
        for source in (src, other):  # the same copy and a different one: both wait their turn
            with pytest.raises(CopyInProgressError, match="another hermes-store copy") as caught:
                copy_history(source, dst)
            assert isinstance(caught.value, CopyError)
            result = run("copy", "--from", source, "--to", dst)
            assert result.code != 0 and "another hermes-store copy" in one_line_error(result, result.code)
        if before is not None:
            assert file_state(dst) == before
        with SessionDB(dst) as db:
            assert everything(db) == during
    finally:
        go.write_text("go")
        out, err = first.communicate(timeout=600)
    assert first.returncode == 0 and "finished" in out, err
    with SessionDB(dst) as db:
        assert contents(db) == want
    assert copy_history(src, dst).already_complete  # the lock went with the first copy
    if direction[1] == "sqlite":
        assert not Path(f"{dst}.copy-lock").exists()


def test_a_copy_into_and_out_of_tenant_schemas(place: Callable[[str, str], Any], tmp_path: Path) -> None:
    """``?schema=`` on either side: a file into tenant team_a, team_a into team_b of the
    same database, team_b back to a file. Each tenant ends up with the whole history
    and the default store of that database stays empty."""
    src, want, want_hits = filled("sqlite", place)
    server = place("postgresql", "tenants")

    def tenant(schema: str) -> str:
        return make_url(server).update_query_dict({"schema": schema}).render_as_string(hide_password=False)

    assert copy_history(src, tenant("team_a")).ok
    assert copy_history(tenant("team_a"), tenant("team_b")).ok
    back = tmp_path / "back.db"
    assert copy_history(tenant("team_b"), back).ok
    for where in (tenant("team_a"), tenant("team_b"), back):
        with SessionDB(where) as db:
            assert contents(db) == want and hits(db) == want_hits
    with SessionDB(server) as public:
        assert public.session_count() == 0 and public.message_count() == 0
    # The destination lock is per schema: a copy holding team_b leaves team_c free.
    with destination_lock(endpoint(tenant("team_b"), "destination")):
        with pytest.raises(CopyInProgressError):
            copy_history(src, tenant("team_b"))
        assert copy_history(src, tenant("team_c")).ok
    # ... and keyed by the schema the store is in, however the URL names it.
    with destination_lock(endpoint(server, "destination")):
        with pytest.raises(CopyInProgressError):
            copy_history(src, tenant("public"))


# ---------------------------------------------------------------------- a Hermes file as the source


@pytest.mark.parametrize("version", ["11", "30"])
def test_an_unadopted_hermes_file_is_read_through_an_adopted_work_copy(
        version: str, backend: str, place: Callable[[str, str], Any], tmp_path: Path) -> None:
    home = tmp_path / "hermes"
    home.mkdir()
    src = home / "state.db"
    shutil.copyfile(HERMES_DBS / f"hermes_v{version}.db", src)
    before = file_state(src)
    reference = tmp_path / "reference.db"  # what adopting the file in place gives
    shutil.copyfile(src, reference)
    adopt.adopt(reference, backup=False)

    dst = place(backend, "dst")
    report = copy_history(src, dst)
    assert report.ok and report.source_work_copy and report.source_revision == f"{int(version):04d}"
    assert file_state(src) == before and sorted(p.name for p in home.iterdir()) == ["state.db"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".hermes-store-copy-")]
    with SessionDB(reference) as ref, SessionDB(dst) as db:
        assert contents(db) == contents(ref)
        assert report.sessions_copied == 5 and len(contents(db)["messages"]) == 60
        for query in ("kubernetes", "docker", "记忆断裂", "通信", "世界"):
            found = sorted(h["id"] for h in db.search_messages(query, limit=100))
            assert found and found == sorted(h["id"] for h in ref.search_messages(query, limit=100)), query
    assert adopt.needs_adoption(src)  # still Hermes' own, unadopted file


def test_a_work_copy_left_by_a_killed_run_is_removed(place: Callable[[str, str], Any], tmp_path: Path) -> None:
    src = tmp_path / "hermes.db"
    shutil.copyfile(HERMES_DBS / "hermes_v23.db", src)
    stale = tmp_path / ".hermes-store-copy-999999999-abc"
    stale.mkdir()
    (stale / "state.db").write_bytes(b"left behind")
    report = copy_history(src, place("sqlite", "dst"))
    assert report.ok and not stale.exists()


def test_an_older_revision_of_ours_is_upgraded_in_a_work_copy_of_its_own(tmp_path: Path) -> None:
    """A file hermes_store left at an older revision: read at head without upgrading it."""
    src = tmp_path / "old.db"
    migrations.upgrade(src, "0029")
    conn = sqlite3.connect(src)
    conn.execute("INSERT INTO sessions (id, source, started_at, title) VALUES ('old', 'cli', 1.5, 'from 0029')")
    conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('old', 'user', 'kept words', 2.5)")
    conn.commit()
    conn.close()
    before = file_state(src)
    work = tmp_path / "work"
    work.mkdir()
    stages: list[str] = []
    report = copy_history(src, tmp_path / "new.db", work_dir=work, progress=lambda s, d, t: stages.append(s))
    assert report.ok and report.source_work_copy and report.source_revision == "0029"
    assert "snapshot" in stages and list(work.iterdir()) == []
    assert file_state(src) == before and migrations.current(src) == "0029"
    with SessionDB(tmp_path / "new.db") as db:
        assert db.get_session("old")["title"] == "from 0029"
        assert [h["session_id"] for h in db.search_messages("kept")] == ["old"]
    with pytest.raises(errors.DatabaseUnavailableError, match="work folder"):
        copy_history(src, tmp_path / "other.db", work_dir=tmp_path / "no-such-folder")
    assert not (tmp_path / "other.db").exists()


# ---------------------------------------------------------------------- what cannot be stored


@pytest.mark.sqlite_only
def test_links_to_sessions_that_exist_nowhere_are_dropped_and_reported(backend: str, tmp_path: Path) -> None:
    """An old file may hold references its foreign keys never checked; no destination can."""
    src = tmp_path / "src.db"
    with SessionDB(src) as db:
        db.create_session("real", "cli")
        db.append_message("real", "user", "hello")
    conn = sqlite3.connect(src)
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute("INSERT INTO sessions (id, source, started_at, parent_session_id) VALUES ('lost', 'cli', 1.0, 'ghost')")
    conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('nobody', 'user', 'orphan', 2.0)")
    conn.commit()
    conn.close()
    report = copy_history(src, tmp_path / "dst.db")
    assert report.ok and report.dropped_links == [("lost", "ghost")]
    assert report.not_copyable == {"messages": 1}
    with SessionDB(tmp_path / "dst.db") as db:
        assert db.get_session("lost")["parent_session_id"] is None
        assert db.message_count() == 1


# ---------------------------------------------------------------------- bad arguments


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_bad_paths_and_urls_are_typed_errors_that_create_nothing(tmp_path: Path) -> None:
    good = tmp_path / "good.db"
    with SessionDB(good) as db:
        db.create_session("s", "cli")
    text_file = tmp_path / "notes.txt"
    text_file.write_text("not a database\n" * 100)
    folder = tmp_path / "a-folder"
    folder.mkdir()
    hermes = tmp_path / "hermes.db"
    shutil.copyfile(HERMES_DBS / "hermes_v20.db", hermes)
    before = listing(tmp_path)
    hashes = {p: sha(p) for p in (good, text_file, hermes)}
    cases = [
        (good, "mysql://u@h/db", errors.UnsupportedDatabaseError),
        (good, "postgresql+psycopg://u@h:notaport/db", errors.InvalidInputError),
        (good, "postgresql+psycopg://u@h/", errors.InvalidInputError),
        (good, "sqlite:///:memory:", errors.InvalidInputError),
        (good, "", errors.InvalidInputError),
        (good, "bad\x00name.db", errors.InvalidInputError),
        (good, good, errors.InvalidInputError),  # onto itself
        (good, f"sqlite:///{good}", errors.InvalidInputError),
        (good, folder, errors.NotADatabaseError),
        (good, text_file, errors.NotADatabaseError),
        (good, text_file / "below-a-file.db", errors.DatabaseUnavailableError),
        (good, hermes, errors.AdoptionError),  # an unadopted Hermes file is not written into
        (tmp_path / "missing.db", tmp_path / "new.db", errors.DatabaseUnavailableError),
        (text_file, tmp_path / "new.db", errors.NotADatabaseError),
        (folder, tmp_path / "new.db", errors.NotADatabaseError),
        ("ftp://example.com/x", tmp_path / "new.db", errors.UnsupportedDatabaseError),
    ]
    for src, dst, kind in cases:
        with pytest.raises(kind):
            copy_history(src, dst)
        assert listing(tmp_path) == before, (src, dst)
    for src, dst, _kind in cases[:3]:
        line = one_line_error(run("copy", "--from", src, "--to", dst), 1)
        assert "Traceback" not in line
    with pytest.raises(errors.InvalidInputError):
        copy_history(good, tmp_path / "new.db", batch=0)
    assert one_line_error(run("copy", "--from", good, "--to", tmp_path / "new.db", "--batch", "0"), 2)
    assert one_line_error(run("copy", "--from", good), 2)  # --to is required
    assert "not UTF-8" in one_line_error(run("copy", "--from", good, "--to", str(tmp_path / "bad-\udcff.db")), 2)
    assert listing(tmp_path) == before
    assert {p: sha(p) for p in hashes} == hashes
    # A missing folder is not an error: it is made, as for every command that creates a store.
    copy_history(good, tmp_path / "missing-folder" / "x.db")
    with SessionDB(tmp_path / "missing-folder" / "x.db") as copied:
        assert copied.get_session("s") is not None


def test_a_password_in_a_bad_url_is_never_repeated(tmp_path: Path) -> None:
    with pytest.raises(errors.InvalidInputError) as caught:
        copy_history(tmp_path / "x.db", "postgresql+psycopg://user:s3cret@host:port/db")
    assert "s3cret" not in str(caught.value)


def test_server_databases_that_do_not_exist_are_typed_errors(pg_url: str, tmp_path: Path) -> None:
    missing = make_url(pg_url).set(database="hs_copy_no_such_database").render_as_string(hide_password=False)
    src = tmp_path / "src.db"
    with SessionDB(src) as db:
        db.create_session("s", "cli")
    with pytest.raises(errors.DatabaseUnavailableError):
        copy_history(src, missing)
    with pytest.raises(errors.DatabaseUnavailableError):
        copy_history(missing, tmp_path / "dst.db")
    assert not (tmp_path / "dst.db").exists()
    line = one_line_error(run("copy", "--from", src, "--to", missing), 1)
    assert "hs_copy_no_such_database" in line


def test_an_empty_server_database_has_nothing_to_copy(pg_database: str, tmp_path: Path) -> None:
    with pytest.raises(errors.NotMigratedError):
        copy_history(pg_database, tmp_path / "dst.db")
    assert not (tmp_path / "dst.db").exists()
    assert migrations.current(pg_database) is None


# ---------------------------------------------------------------------- the command line


def test_the_command_prints_counts_and_checksums(backend: str, place: Callable[[str, str], Any], tmp_path: Path) -> None:
    src, want, _hits = filled("sqlite", place)
    dst = place(backend, "dst")
    human = run("--db", src, "copy", "--to", dst)  # --from defaults to the --db database
    assert human.code == 0, human.stderr
    assert f"Copied from {src} to " in human.stdout and "7 session(s)" in human.stdout
    assert "Verified: row counts and 7 session checksum(s) match" in human.stdout
    assert "compression_locks" in human.stdout  # what stayed behind is said
    doc = run("--json", "copy", "--from", src, "--to", dst).json()
    assert doc["ok"] and doc["already_complete"] and doc["sessions_present"] == 7
    assert doc["tables"]["messages"] == {"source": len(want["messages"]), "destination": len(want["messages"])}
    assert doc["source_checksum"] == doc["destination_checksum"] and len(doc["source_checksum"]) == 64
    assert "Nothing to copy" in run("copy", "--from", src, "--to", dst).stdout
    target = file_target(dst) if backend == "sqlite" else server_target(dst)
    assert snapshot(target) == snapshot(file_target(src))  # the export view: every session, decoded
