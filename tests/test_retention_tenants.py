"""Retention per tenant (issue 34, point 2): each PostgreSQL tenant schema keeps its own
policies, and applying one tenant's touches no other tenant's rows."""

from __future__ import annotations

import json
import time

from sqlalchemy.engine import make_url

from hermes_store import SessionDB, UnitOfWork
from hermes_store.repositories.retention import RetentionRepository
from hermes_store.keys import DAY, RETENTION_TOOL_MARKER

from .factories import set_times
from .test_cli import ok


def _tenant(url: str, schema: str) -> str:
    return make_url(url).update_query_dict({"schema": schema}).render_as_string(hide_password=False)


def _fill(db: SessionDB, now: float) -> None:
    for source in ("cli", "telegram"):
        s = f"{source}-old"
        db.create_session(s, source)
        db.append_message(s, "user", f"word{source} question")
        db.append_message(s, "tool", "toolword " + "x " * 40, tool_call_id="c1", tool_name="terminal")
        set_times(db, s, started_at=now - 100 * DAY, ended_at=now - 99 * DAY, end_reason="done",
                  messages_at=now - 100 * DAY)


def test_each_tenant_applies_its_own_policies(pg_database: str) -> None:
    now = time.time()
    a, b = _tenant(pg_database, "team_a"), _tenant(pg_database, "team_b")
    for url in (a, b):
        with SessionDB(url) as db:
            _fill(db, now)
    with SessionDB(a) as db, UnitOfWork(db.engine) as uow:
        RetentionRepository(uow.conn).set_policy("telegram", delete_after_days=30)
    ok("--url", pg_database, "--schema", "team_b", "retention", "set", "--redact-after-days", "30")
    shown_a = json.loads(ok("--url", pg_database, "--schema", "team_a", "--json", "retention", "show").stdout)
    shown_b = json.loads(ok("--url", pg_database, "--schema", "team_b", "--json", "retention", "show").stdout)
    assert [p["source"] for p in shown_a["policies"]] == ["telegram"]
    assert [p["source"] for p in shown_b["policies"]] == ["*"]

    done_a = json.loads(ok("--url", pg_database, "--schema", "team_a", "--json", "retention", "apply").stdout)
    assert (done_a["sessions_deleted"], done_a["tool_outputs_redacted"]) == (1, 0)
    with SessionDB(b) as db:  # team_b untouched by team_a's run
        assert {s["id"] for s in db.list_sessions_rich(limit=10)} == {"cli-old", "telegram-old"}
        assert db.get_messages("cli-old")[1]["content"].startswith("toolword")
    done_b = json.loads(ok("--url", pg_database, "--schema", "team_b", "--json", "retention", "apply").stdout)
    assert (done_b["sessions_deleted"], done_b["tool_outputs_redacted"]) == (0, 2)
    with SessionDB(a) as db:
        assert {s["id"] for s in db.list_sessions_rich(limit=10)} == {"cli-old"}
        assert db.get_messages("cli-old")[1]["content"].startswith("toolword")
        assert {h["session_id"] for h in db.search_messages("toolword")} == {"cli-old"}
    with SessionDB(b) as db:
        assert all(db.get_messages(s)[1]["content"] == RETENTION_TOOL_MARKER for s in ("cli-old", "telegram-old"))
        assert db.search_messages("toolword") == []
        assert {h["session_id"] for h in db.search_messages("wordtelegram")} == {"telegram-old"}
