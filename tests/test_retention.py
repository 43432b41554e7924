"""Retention policies (issue 34, point 2): stored per source (hs0009), applied in batches.

A corpus of four sources, each with sessions of every kind a policy must tell apart
(old and ended, pinned, titled by a person, titled by a model, recent, still running),
is given three policies (one source deletes, one redacts, the default does both). What
goes and what stays is counted exactly, the dry run announces the same counts, the
search indexes pass their integrity check, and search finds what was kept and not what
was dropped. On SQLite and PostgreSQL (``both_backends``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from hermes_store import SessionDB, errors
from hermes_store.keys import DAY, RETENTION_REASONING_MARKER, RETENTION_TOOL_MARKER
from hermes_store.operations import UnitOfWorkSteps, apply_retention, retention_plan
from hermes_store.operations import retention as retention_ops
from hermes_store.repositories.base import SESSIONS
from hermes_store.repositories.retention import RetentionRepository
from hermes_store.uow import UnitOfWork

from .factories import set_times
from .test_cli import ok, one_line_error, run

pytestmark = pytest.mark.both_backends

SOURCES = ("cli", "telegram", "discord", "cron")
#: kind -> (ended days ago or None: running, pinned, title source or None)
KINDS: dict[str, tuple[float | None, bool, str | None]] = {
    "old": (100.0, False, None),
    "pinned": (100.0, True, None),
    "usertitled": (100.0, False, "user"),
    "llmtitled": (100.0, False, "llm"),
    "recent": (5.0, False, None),
    "running": (None, False, None),
}
LONG_TOOL = "output line of the tool " * 8
LONG_THOUGHT = "a long chain of thought " * 6


def sid(source: str, kind: str) -> str:
    return f"{source}-{kind}"


def word(prefix: str, source: str, kind: str) -> str:
    """A word of letters only that appears in one message of the corpus."""
    return f"{prefix}{source}{kind}"


def build(db: SessionDB, now: float) -> None:
    for source in SOURCES:
        for kind, (ended_ago, pinned, title_source) in KINDS.items():
            s = sid(source, kind)
            db.create_session(s, source)
            db.append_message(s, "user", f"question {word('u', source, kind)} please")
            db.append_message(s, "assistant", "calling a tool", reasoning=LONG_THOUGHT,
                              tool_calls=[{"id": "c1", "type": "function",
                                           "function": {"name": "terminal", "arguments": "{}"}}])
            db.append_message(s, "tool", f"{word('t', source, kind)} {LONG_TOOL}", tool_call_id="c1",
                              tool_name="terminal")
            db.append_message(s, "tool", "ok", tool_call_id="c2", tool_name="terminal")  # shorter than the marker
            if title_source is not None:
                with UnitOfWork(db.engine) as uow:
                    uow.sessions.set_title(s, f"title of {s}", title_source)
            if pinned:
                with UnitOfWork(db.engine) as uow:
                    uow.sessions.update_fields(s, pinned=1)
            started = now - 101 * DAY if ended_ago is not None and ended_ago > 50 else now - 6 * DAY
            if ended_ago is None:
                started = now - 101 * DAY
            set_times(db, s, started_at=started, ended_at=None if ended_ago is None else now - ended_ago * DAY,
                      end_reason=None if ended_ago is None else "done", messages_at=started)


def set_policies(db: SessionDB) -> None:
    with UnitOfWork(db.engine) as uow:
        RetentionRepository(uow.conn).set_policy("telegram", delete_after_days=30)
        RetentionRepository(uow.conn).set_policy("cli", redact_after_days=30)
        RetentionRepository(uow.conn).set_policy("*", delete_after_days=60, redact_after_days=30)


#: With the policies above: the sessions deleted (telegram's and the default's old,
#: unprotected, ended ones) and the sessions whose old rows are redacted.
DELETED = {sid(src, k) for src in ("telegram", "discord", "cron") for k in ("old", "llmtitled")}
REDACTED = {sid("cli", k) for k in ("old", "llmtitled", "running")} | \
    {sid(src, "running") for src in ("discord", "cron")}


@pytest.fixture
def corpus(db: SessionDB) -> SessionDB:
    build(db, time.time())
    set_policies(db)
    return db


def ids(db: SessionDB) -> set[str]:
    with UnitOfWork(db.engine, write=False) as uow:
        assert uow.conn is not None
        return {r[0] for r in uow.conn.exec_driver_sql(
            f"SELECT id FROM {uow.schema + '.' if uow.schema else ''}sessions")}


def found(db: SessionDB, term: str) -> set[str]:
    return {h["session_id"] for h in db.search_messages(term, limit=50)}


def test_policies_are_stored_shown_changed_and_removed(db: SessionDB) -> None:
    with UnitOfWork(db.engine) as uow:
        assert RetentionRepository(uow.conn).policies() == []
        RetentionRepository(uow.conn).set_policy("telegram", delete_after_days=30)
        changed = RetentionRepository(uow.conn).set_policy("telegram", redact_after_days=7.5, include_pinned=True)
    assert (changed.delete_after_days, changed.redact_after_days, changed.include_pinned) == (30.0, 7.5, True)
    with UnitOfWork(db.engine) as uow:
        RetentionRepository(uow.conn).set_policy("*", delete_after_days=None, redact_after_days=90)
        assert [p.source for p in RetentionRepository(uow.conn).policies()] == ["*", "telegram"]
        with pytest.raises(errors.InvalidInputError):
            RetentionRepository(uow.conn).set_policy("cli", delete_after_days=-1)
        with pytest.raises(errors.InvalidInputError):
            RetentionRepository(uow.conn).set_policy("cli", shred=True)
        assert RetentionRepository(uow.conn).remove_policy("telegram") is True
        assert RetentionRepository(uow.conn).remove_policy("telegram") is False
        assert [p.source for p in RetentionRepository(uow.conn).policies()] == ["*"]


def test_apply_keeps_and_removes_exactly_what_the_policies_say(corpus: SessionDB) -> None:
    db = corpus
    steps = UnitOfWorkSteps(db.engine)
    before = ids(db)
    plan = retention_plan(steps).as_dict()
    done = apply_retention(steps, delete_batch=2, redact_batch=3).as_dict()

    assert ids(db) == before - DELETED
    assert done["sessions_deleted"] == len(DELETED) == 6 and done["messages_deleted"] == 4 * len(DELETED)
    assert done["tool_outputs_redacted"] == len(REDACTED) == 5  # the "ok" outputs stay: shorter than the marker
    assert done["reasoning_redacted"] == len(REDACTED)
    for key in ("sessions_deleted", "messages_deleted", "tool_outputs_redacted", "reasoning_redacted"):
        assert plan[key] == done[key], key  # the dry run announced the same counts
    assert plan["bytes_deleted"] > 0 and plan["bytes_redacted"] >= 5 * len(LONG_TOOL)
    by_source = {p["source"]: p for p in done["policies"]}
    assert (by_source["telegram"]["sessions_deleted"], by_source["*"]["sessions_deleted"]) == (2, 4)
    assert by_source["telegram"]["batches"] == 1 and by_source["*"]["batches"] >= 2 + 2  # 4 sessions, 2 a batch

    # Rows, ids and token counts stay; only the tool output and the reasoning changed.
    for s in REDACTED:
        msgs = db.get_messages(s)
        assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool"]
        assert msgs[2]["content"] == RETENTION_TOOL_MARKER and msgs[3]["content"] == "ok"
        assert msgs[1]["reasoning"] == RETENTION_REASONING_MARKER and msgs[1]["tool_calls"]
    for s in before - DELETED - REDACTED:
        msgs = db.get_messages(s)
        assert msgs[2]["content"].startswith("t") and msgs[1]["reasoning"] == LONG_THOUGHT, s
    assert db.get_session(sid("cli", "old"))["message_count"] == 4

    # The indexes followed: integrity holds, kept words are found, dropped ones are not.
    assert all(problem is None for problem in db.check_fts().values())
    for source in SOURCES:
        for kind in KINDS:
            s = sid(source, kind)
            assert found(db, word("u", source, kind)) == (set() if s in DELETED else {s}), s
            assert found(db, word("t", source, kind)) == (set() if s in DELETED | REDACTED else {s}), s
    again = apply_retention(steps).as_dict()
    assert (again["sessions_deleted"], again["tool_outputs_redacted"], again["reasoning_redacted"]) == (0, 0, 0)


def test_protected_sessions_go_when_the_policy_says_so(corpus: SessionDB) -> None:
    with UnitOfWork(corpus.engine) as uow:
        RetentionRepository(uow.conn).set_policy("telegram", include_pinned=True, include_user_titled=True)
    apply_retention(UnitOfWorkSteps(corpus.engine))
    left = {s for s in ids(corpus) if s.startswith("telegram-")}
    assert left == {sid("telegram", k) for k in ("recent", "running")}


def test_the_earlier_parts_of_a_protected_conversation_are_kept(db: SessionDB) -> None:
    """A conversation compressed twice is three sessions, and Hermes moves its title to
    the newest: protecting that one protects the two it continues. Batches of one walk
    past the protected sessions (a page holding only those) to the ones that go."""
    now = time.time()
    chains = {("a", "b", "c"): "title", ("p1", "p2"): "pin", ("x", "y"): None}
    for chain, protect in chains.items():
        parent = None
        for k, s in enumerate(chain):
            db.create_session(s, "telegram", parent_session_id=parent)
            db.append_message(s, "user", f"word{s}")
            newest = k == len(chain) - 1
            set_times(db, s, started_at=now - 100 * DAY + k, ended_at=now - 99 * DAY + k,
                      end_reason="done" if newest else "compression", messages_at=now - 100 * DAY + k)
            parent = s
        with UnitOfWork(db.engine) as uow:
            if protect == "title":
                assert uow.conn is not None
                uow.conn.execute(
                    SESSIONS.update().where(SESSIONS.c.id == chain[-1]).values(title="ours", title_source="user"))
            elif protect == "pin":
                uow.sessions.update_fields(chain[-1], pinned=1)
    with UnitOfWork(db.engine) as uow:
        RetentionRepository(uow.conn).set_policy("telegram", delete_after_days=30)
        assert RetentionRepository(uow.conn).protected(RetentionRepository(uow.conn).policies()[0]) == \
            {"a", "b", "c", "p1", "p2"}
    steps = UnitOfWorkSteps(db.engine)
    assert retention_plan(steps).total("sessions_deleted") == 2
    done = apply_retention(steps, delete_batch=1)
    assert done.total("sessions_deleted") == 2 and done.total("messages_deleted") == 2
    assert ids(db) == {"a", "b", "c", "p1", "p2"}
    with UnitOfWork(db.engine) as uow:
        RetentionRepository(uow.conn).set_policy("telegram", include_pinned=True, include_user_titled=True)
    assert apply_retention(steps).total("sessions_deleted") == 5 and ids(db) == set()


def test_the_archive_is_written_and_fsynced_before_anything_is_deleted(corpus: SessionDB, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "archive"
    folder.mkdir()
    with UnitOfWork(corpus.engine) as uow:
        RetentionRepository(uow.conn).set_policy("*", archive_dir=str(folder))
    before = ids(corpus)

    def broken(self: Any, records: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(retention_ops.Archive, "write", broken)
    with pytest.raises(OSError):
        apply_retention(UnitOfWorkSteps(corpus.engine))
    assert ids(corpus) == before  # the archive failed: nothing deleted
    monkeypatch.undo()

    synced: list[int] = []
    real_fsync = retention_ops.os.fsync
    monkeypatch.setattr(retention_ops.os, "fsync", lambda fd: (synced.append(len(ids(corpus))), real_fsync(fd)))
    report = apply_retention(UnitOfWorkSteps(corpus.engine), delete_batch=3)
    by_source = {p.source: p for p in report.policies}
    assert by_source["*"].sessions_deleted == by_source["*"].archived_sessions == 4
    # The folder, then each batch of 3 is fsynced while its sessions are all still there.
    assert synced == [len(before), len(before), len(before) - 3]
    assert len(ids(corpus)) == len(before) - len(DELETED)
    lines = [json.loads(x) for x in Path(by_source["*"].archive or "").read_text().splitlines()]
    assert {r["id"] for r in lines} == {s for s in DELETED if not s.startswith("telegram")}
    assert all(len(r["messages"]) == 4 for r in lines)
    assert oct(Path(by_source["*"].archive or "").stat().st_mode & 0o777) == "0o600"


def test_a_missing_archive_folder_is_refused_before_anything_goes(corpus: SessionDB, tmp_path: Path) -> None:
    with UnitOfWork(corpus.engine) as uow:
        RetentionRepository(uow.conn).set_policy("*", archive_dir=str(tmp_path / "gone"))
    before = ids(corpus)
    with pytest.raises(errors.InvalidInputError, match="does not exist"):
        apply_retention(UnitOfWorkSteps(corpus.engine))
    assert ids(corpus) == before


def test_auto_maintenance_applies_the_policies(corpus: SessionDB) -> None:
    out = corpus.maybe_auto_prune_and_vacuum(retention_days=365, vacuum=False)
    assert "error" not in out and out["pruned"] == 0
    assert out["retention"]["sessions_deleted"] == len(DELETED)
    assert out["retention"]["tool_outputs_redacted"] == len(REDACTED)
    assert ids(corpus).isdisjoint(DELETED)
    assert corpus.maybe_auto_prune_and_vacuum(retention_days=365)["skipped"] is True  # once per interval


def test_a_store_without_policies_reports_as_before(db: SessionDB) -> None:
    build(db, time.time())
    out = db.maybe_auto_prune_and_vacuum(retention_days=365)
    assert out == {"skipped": False, "pruned": 0, "vacuumed": False}


def _target(db: SessionDB, backend: str, request: pytest.FixtureRequest) -> list[str]:
    if backend == "sqlite":
        return ["--db", str(db.db_path)]
    fixture = "pg_database" if backend == "postgresql" else "citus_store"
    return ["--url", str(request.getfixturevalue(fixture))]


def test_the_command_line(corpus: SessionDB, backend: str, request: pytest.FixtureRequest) -> None:
    where = _target(corpus, backend, request)
    shown = json.loads(ok(*where, "--json", "retention", "show").stdout)
    assert {p["source"] for p in shown["policies"]} == {"*", "cli", "telegram"}
    ok(*where, "retention", "set", "--source", "discord", "--delete-after-days", "never", "--redact-after-days", "1")
    shown = json.loads(ok(*where, "--json", "retention", "show").stdout)
    discord = next(p for p in shown["policies"] if p["source"] == "discord")
    assert (discord["delete_after_days"], discord["redact_after_days"]) == (None, 1.0)
    assert "discord" in ok(*where, "retention", "show").stdout
    dry = json.loads(ok(*where, "--json", "retention", "apply", "--dry-run").stdout)
    assert dry["dry_run"] is True and dry["sessions_deleted"] == len(DELETED) - 2  # discord's now kept
    assert ids(corpus) >= DELETED  # a dry run changes nothing
    assert "Would delete" in ok(*where, "retention", "apply", "--dry-run").stdout
    done = json.loads(ok(*where, "--json", "retention", "apply").stdout)
    assert done["sessions_deleted"] == dry["sessions_deleted"]
    assert json.loads(ok(*where, "--json", "retention", "set", "--source", "discord", "--remove").stdout) == \
        {"source": "discord", "removed": True}
    assert "days" in one_line_error(run(*where, "retention", "set", "--delete-after-days", "soon"), 2)
    assert "nothing to set" in one_line_error(run(*where, "retention", "set"), 2)


def test_a_deletion_batch_ends_once_its_sessions_hold_enough_messages(corpus: SessionDB) -> None:
    """A batch stops at ``max_messages`` (one session at least), so a page of long
    sessions never holds the write lock for long; the next page starts after it."""
    with UnitOfWork(corpus.engine, write=False) as uow:
        repo = RetentionRepository(uow.conn)
        policy = next(p for p in repo.policies() if p.is_default)
        others = [p.source for p in repo.policies() if not p.is_default]
        first, key = repo.sessions_to_delete(policy, others, 10, max_messages=5)  # 4 messages each
        assert len(first) == 2 and key is not None
        rest, end = repo.sessions_to_delete(policy, others, 10, after=key, max_messages=5)
        assert len(rest) == 2 and not set(first) & set(rest)
        assert repo.sessions_to_delete(policy, others, 10, after=end) == ([], None)
