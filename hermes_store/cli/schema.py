"""Schema commands: upgrade, current, adopt, and demo (a small database to try things on)."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import click
from rich.text import Text

from .. import adopt as adopt_mod, encryption, errors, migrations, paths
from ..adopt import finish_interrupted
from ..engine import to_url
from ..facade import SessionDB
from ..keys import DAY
from ._common import (
    PROG,
    TEXT,
    CliError,
    State,
    adopt_progress,
    check_path_kind,
    create_private_file,
    fitted_table,
    global_options,
    known_revisions,
    refuse_unadopted,
    require_file,
    schema_tables,
    server_tables,
    session_db,
    stdout_console,
    store_revision,
    _state,
)

# ---------------------------------------------------------------------------- schema


@click.command()
@click.option("--revision", type=TEXT, default="head", show_default=True, metavar="REV",
              help="Target revision (0001 … head).")
@global_options
def upgrade(revision: str) -> None:
    """Create or migrate the database to a revision.

    A file written by Hermes is adopted first (the original is kept as a backup).
    """
    st = _state()
    if revision != "head" and revision not in known_revisions():
        raise click.BadParameter(f"unknown revision {revision!r} (known: 0001 … {migrations.head()}, head)",
                                 param_hint="'--revision'")
    adopted: adopt_mod.AdoptionReport | None = None
    if st.url is not None:
        # A server: no file to create or adopt; "created" means our tables were not there.
        previous = migrations.current(st.url)
        new = migrations.upgrade(st.url, revision)
        created = previous is None
        tables, indexes = server_tables(st.url)
    elif st.key is not None:  # an encrypted file: migrated through its key, never adopted (Hermes' are plain)
        path = st.file
        check_path_kind(path)
        existed = path.exists()
        previous, new = upgrade_encrypted(st, path, revision, existed)
        created = not existed
        tables, indexes = schema_tables(path, st.key)
    else:
        path = st.file
        check_path_kind(path)
        existed = path.exists()
        if existed:
            check_plain_file(path)  # a text file is refused by name, not by a driver error
        if existed and adopt_mod.needs_adoption(path):
            previous = None
            with st.progress("percent") as bar:
                adopted = adopt_mod.adopt(path, revision=revision, progress=adopt_progress(bar))
            new = adopted.revision
        else:
            previous = migrations.current(path) if existed else None
            # Going back is refused by migrations.upgrade itself (by place in the chain).
            if not existed:
                create_private_file(path)
            new = migrations.upgrade(path, revision)
        created = not existed
        tables, indexes = schema_tables(path)
    doc = {
        "db": st.where,
        "created": created,
        "previous": previous,
        "revision": new,
        "head": migrations.head(),
        "adopted": adopted is not None,
        "hermes_schema_version": adopted.schema_version if adopted else None,
        "backup": str(adopted.backup_path) if adopted and adopted.backup_path else None,
        "tables": {name: count for name, count in tables},
        "fts_indexes": indexes,
    }
    if st.json:
        st.emit(doc)
        return
    out = stdout_console()
    if adopted:
        line = Text(f"Adopted Hermes schema_version {adopted.schema_version} → revision {new}")
    elif created and st.url is None:
        line = Text(f"Created {st.where} at revision {new}")
    elif previous == new:
        line = Text(f"{st.where} is already at revision {new}")
    else:
        line = Text(f"Upgraded {st.where}: {previous or 'empty'} → {new}")
    out.print(line)
    if doc["backup"]:
        out.print(Text(f"Original kept as {doc['backup']}"))
    out.print(fitted_table(out, ["Table", "Rows"], [[name, f"{count:,}"] for name, count in tables], flex=0, right=[1]))
    if indexes:
        out.print(Text("Search indexes: " + ", ".join(indexes)))


def check_plain_file(path: Path) -> None:
    """:func:`hermes_store.adopt.check_file`; a file that looks encrypted, opened with no
    key, is EncryptionKeyError naming the key to supply."""
    try:
        adopt_mod.check_file(path, recovery_ok=True)
    except errors.NotADatabaseError as exc:
        raise encryption.refused_without_key(path, exc) from exc


def upgrade_encrypted(st: State, path: Path, revision: str, existed: bool) -> tuple[str | None, str | None]:
    """Create or migrate an encrypted file, only ever through a keyed connection: the key
    is checked by a read-only open first (a wrong one refused, nothing written), and a
    new file is SQLCipher's from its first byte (no plain header is written first)."""
    assert st.key is not None
    if existed:
        previous = store_revision(st)[0]  # read-only: the key checked before anything is written
        finish_interrupted(paths.resolve_link(path))  # an encrypt/rekey swap a kill interrupted
    else:
        previous = None
        paths.make_parents(paths.check_target(path, write=True, create=True, make_parents=True))
    return previous, migrations.upgrade(encryption.url_with_key(to_url(path), st.key), revision)


@click.command()
@global_options
def current() -> None:
    """Show the database's revision and whether it is at head.

    Like every read-only command it exits 1 when there is no store to report on (an
    empty database, or a Hermes file not adopted yet), saying what to run; the JSON
    document still goes to stdout, the error to stderr.
    """
    st = _state()
    head = migrations.head()
    doc: dict[str, Any] = {"db": st.where, "revision": None, "head": head, "up_to_date": False,
                           "needs_adoption": False, "hermes_schema_version": None, "managed_by": None}
    path = st.file if st.url is None else None
    if path is not None:
        require_file(path)
        if st.key is None:  # an encrypted file is read through its key only (never a Hermes file)
            check_plain_file(path)
    if path is not None and st.key is None and adopt_mod.needs_adoption(path):
        det = adopt_mod.detect(path, deep=False)
        doc.update(needs_adoption=True, hermes_schema_version=det.schema_version)
    else:
        rev, host_table = store_revision(st)  # read only: a file's bytes stay as they are
        doc.update(revision=rev, up_to_date=rev == head, managed_by=host_table)
    if st.json:
        st.emit(doc)
    if doc["needs_adoption"]:
        raise CliError(f"{st.where}: Hermes schema_version {doc['hermes_schema_version']}, not adopted "
                       f"(run '{PROG} {st.flag} adopt'; head is {head})", code="needs_adoption")
    if doc["revision"] is None:
        raise CliError(f"{st.where}: no hermes_store revision yet; create one with "
                       f"'{PROG} {st.flag} upgrade' (head is {head})", code="no_store")
    if not st.json:
        if doc["up_to_date"]:
            status = "head"
        elif doc["managed_by"]:
            status = (f"head is {head}; recorded in {doc['managed_by']} by the application that embeds it: "
                      "run `alembic upgrade heads` in that project")
        else:
            status = f"head is {head}; run '{PROG} upgrade'"
        stdout_console().print(Text(f"{doc['revision']} ({status})"))


@click.command()
@click.option("--check", "check_only", is_flag=True, help="Only report what was detected; change nothing.")
@click.option("--no-backup", is_flag=True, help="Do not keep the original as <name>.pre-adopt.bak.")
@global_options
def adopt(check_only: bool, no_backup: bool) -> None:
    """Adopt a Hermes-made state.db, keeping every row.

    Works on files from Hermes schema_version 1 to 30. The original is kept as
    <name>.pre-adopt.bak unless --no-backup.
    """
    st = _state()
    if st.url is not None:
        raise CliError("adopt works on a Hermes state.db file (--db PATH); to move a file to a server, "
                       f"'{PROG} copy --from PATH --to URL'")
    path = st.file
    require_file(path)
    if st.key is not None:
        adopt_encrypted(st, path)
        return
    if path.stat().st_size == 0 and not check_only:
        # A 0-byte file is a new, empty database: nothing of Hermes' to keep.
        report = adopt_mod.adopt(path, backup=not no_backup)
        if st.json:
            st.emit({"db": str(path), "adopted": False, "already_adopted": False,
                     "revision": report.revision, "message": report.message})
        else:
            stdout_console().print(Text(report.message))
        return
    try:
        det = adopt_mod.detect(path, deep=False)
    except errors.NotADatabaseError as exc:
        raise encryption.refused_without_key(path, exc) from exc  # encrypted: name the key
    detected: dict[str, Any] = {
        "schema_version": det.schema_version,
        "shape": det.shape,
        "stamp": det.revision if not det.already_adopted else None,
        "repairs": [r.description for r in det.repairs],
        "notes": list(det.notes),
        "problems": list(det.problems),
    }
    doc: dict[str, Any] = {"db": str(path), "detected": detected, "adopted": False,
                           "already_adopted": det.already_adopted,
                           "revision": det.revision if det.already_adopted else None, "backup": None,
                           "backup_wal": None, "row_counts": {}, "message": None}
    out = stdout_console()
    if not st.json:
        if det.already_adopted:
            out.print(Text(f"{path} is already a hermes_store database (revision {det.revision}); nothing to adopt"))
            return
        out.print(Text(f"Detected: Hermes schema_version {det.schema_version}, shape {det.shape}"))
        for label, key in (("Repair", "repairs"), ("Note", "notes"), ("Problem", "problems")):
            items = detected[key]
            for item in items:
                out.print(Text(f"  {label}: {item}"))
    if det.already_adopted or check_only:
        if st.json:
            doc["message"] = "already adopted" if det.already_adopted else "check only; nothing changed"
            st.emit(doc)
        elif det.problems:
            raise CliError(f"{path} cannot be adopted as it is ({len(det.problems)} problem(s) above)")
        else:
            out.print(Text("Adoptable; nothing changed (--check)."))
        return
    with st.progress("percent") as bar:
        report = adopt_mod.adopt(path, backup=not no_backup, progress=adopt_progress(bar))
    doc.update(
        adopted=report.adopted, revision=report.revision, message=report.message,
        backup=str(report.backup_path) if report.backup_path else None,
        backup_wal=str(report.backup_wal_path) if report.backup_wal_path else None,
        row_counts=dict(report.row_counts),
        hidden_sessions=dict(report.hidden_sessions),
    )
    doc["detected"]["stamp"] = report.stamped or det.revision
    if st.json:
        st.emit(doc)
        return
    out.print(Text(f"Stamped {report.stamped or det.revision}, upgraded to {report.revision}"))
    if report.backup_path:
        wal = f" (+ {report.backup_wal_path})" if report.backup_wal_path else ""
        out.print(Text(f"Backup: {report.backup_path}{wal}"))
    else:
        out.print(Text("No backup kept (--no-backup)"))
    if report.row_counts:
        kept = ", ".join(f"{k} {v:,}" for k, v in sorted(report.row_counts.items()) if v)
        out.print(Text(f"Rows kept: {kept or 'none'}"))
    for note in report.notes:
        if "not in the default session list" in note:  # say why `sessions` lists fewer than were kept
            out.print(Text(f"Note: {note}"))


def adopt_encrypted(st: State, path: Path) -> None:
    """``adopt`` on an encrypted file: never a Hermes file (Hermes writes plain ones, and
    ``encrypt`` refuses one not adopted), so a store of ours is reported as adopted
    already (read through its key, nothing written) and anything else is refused."""
    revision = store_revision(st)[0] if path.stat().st_size else None
    if revision is None:
        raise CliError(f"{path} is opened with a key and holds no hermes_store database: an encrypted file is "
                       f"never a Hermes state.db, nothing to adopt; create the store with "
                       f"'{PROG} {st.flag} upgrade'", code="no_store")
    detected = {"schema_version": None, "shape": "encrypted", "stamp": None, "repairs": [],
                "notes": ["an encrypted hermes_store database (read with its key)"], "problems": []}
    if st.json:
        st.emit({"db": str(path), "detected": detected, "adopted": False, "already_adopted": True,
                 "revision": revision, "backup": None, "backup_wal": None, "row_counts": {},
                 "message": "already adopted", "encrypted": True})
        return
    stdout_console().print(Text(f"{path} is already a hermes_store database (revision {revision}, encrypted); "
                                "nothing to adopt"))


# ---------------------------------------------------------------------------- demo


#: The clock the demo's session ids are written on: "now" reads as this moment, so the
#: ids are the same on every run (README.md names one: ``show 20261130_03``), while the
#: sessions' timestamps stay relative to the real clock (``prune --older-than-days 90``
#: removes the old one whenever the demo is written).
DEMO_ID_NOW = datetime(2026, 11, 30, 3, 58, 20)


def _demo_id(ts: float, now: float, suffix: str) -> str:
    """Hermes' session id format (start time plus a short hex tail), with the start time
    read on the fixed ``DEMO_ID_NOW`` clock: ``ts - now`` seconds from it."""
    return (DEMO_ID_NOW + timedelta(seconds=round(ts - now))).strftime("%Y%m%d_%H%M%S_") + suffix


def write_demo(db: SessionDB) -> list[str]:
    """A few realistic sessions: English and CJK text, tool calls and results, a title,
    a compression chain, a delegate child, usage with a side task, and one old session
    that ``prune --older-than-days 90`` would remove."""
    now = time.time()
    ids: list[str] = []

    def session(start: float, suffix: str, source: str, model: str, **kw: Any) -> str:
        sid = _demo_id(start, now, suffix)
        db.create_session(sid, source, model=model, started_at=start, **kw)
        ids.append(sid)
        return sid

    def call(cid: str, name: str, args: dict[str, Any]) -> list[dict[str, Any]]:
        arguments = json.dumps(args, ensure_ascii=False)
        return [{"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}]

    def msgs(sid: str, start: float, items: list[dict[str, Any]]) -> None:
        # One by one: ids must follow conversation order (append_messages groups rows
        # by column set, so mixed rows would not keep their order).
        for i, m in enumerate(items):
            m = dict(m)
            db.append_message(sid, m.pop("role"), m.pop("content", None), timestamp=start + 20 * i, **m)

    def end(sid: str, at: float, reason: str) -> None:
        db.update_session(sid, ended_at=at, end_reason=reason)

    # 1. A titled debugging session, compressed once: root → continuation.
    t1 = now - 2 * DAY
    root = session(t1, "a41c9e", "cli", "anthropic/claude-sonnet-4",
                   system_prompt="You are Hermes, a helpful agent with a terminal.")
    db.set_session_title(root, "Debugging a CrashLoopBackOff")
    msgs(root, t1, [
        {"role": "user",
         "content": "My api pod keeps restarting with CrashLoopBackOff in the staging Kubernetes cluster."
                    " Can you find out why?"},
        {"role": "assistant", "content": "Let me look at the pod's logs first.", "finish_reason": "tool_calls",
         "tool_calls": call("call_k1", "terminal",
                            {"command": "kubectl logs deploy/api -n staging --previous --tail 20"})},
        {"role": "tool", "tool_call_id": "call_k1", "tool_name": "terminal",
         "content": "Error: connect ECONNREFUSED 10.0.3.17:5432\n    at TCPConnectWrap.afterConnect\n"
                    "panic: database not reachable"},
        {"role": "assistant", "finish_reason": "stop",
         "content": "The container exits because it cannot reach Postgres at 10.0.3.17:5432. "
                    "The DATABASE_URL secret still points at the old database service."},
        {"role": "user", "content": "Fix the secret and restart the deployment."},
        {"role": "assistant", "finish_reason": "tool_calls", "content": "",
         "tool_calls": call("call_k2", "terminal", {"command": "kubectl rollout restart deploy/api -n staging"})},
        {"role": "tool", "tool_call_id": "call_k2", "tool_name": "terminal",
         "content": "deployment.apps/api restarted"},
    ])
    db.update_token_counts(root, input_tokens=48_210, output_tokens=3_904, cache_read_tokens=31_000,
                           model="anthropic/claude-sonnet-4", estimated_cost_usd=0.2032, api_call_count=4,
                           billing_provider="openrouter", billing_base_url="https://openrouter.ai/api/v1",
                           billing_mode="chat_completions", cost_status="estimated", cost_source="pricing_table")
    db.update_token_counts(root, input_tokens=1_210, output_tokens=14, model="google/gemini-2.5-flash",
                           estimated_cost_usd=0.0004, api_call_count=1, task="title_generation",
                           billing_provider="openrouter", billing_base_url="https://openrouter.ai/api/v1",
                           billing_mode="chat_completions")
    db.update_token_counts(root, input_tokens=52_880, output_tokens=1_650, model="google/gemini-2.5-flash",
                           estimated_cost_usd=0.0201, api_call_count=1, task="compression",
                           billing_provider="openrouter", billing_base_url="https://openrouter.ai/api/v1",
                           billing_mode="chat_completions")
    end(root, t1 + 200, "compression")
    t2 = t1 + 201
    tip = session(t2, "a41c9f", "cli", "anthropic/claude-sonnet-4", parent_session_id=root)
    db.set_session_title(tip, db.get_next_title_in_lineage("Debugging a CrashLoopBackOff"))
    msgs(tip, t2, [
        {"role": "user", "content": "[Context summary] The api pod crashed because DATABASE_URL pointed at the old"
                                    " Postgres service; the secret was fixed and the deployment restarted."},
        {"role": "user", "content": "Is the pod healthy now?"},
        {"role": "assistant", "finish_reason": "tool_calls", "content": "",
         "tool_calls": call("call_k3", "terminal", {"command": "kubectl get pods -n staging -l app=api"})},
        {"role": "tool", "tool_call_id": "call_k3", "tool_name": "terminal",
         "content": "NAME                   READY   STATUS    RESTARTS   AGE\n"
                    "api-7d9f8c6b5d-x2kq9   1/1     Running   0          2m"},
        {"role": "assistant", "finish_reason": "stop", "content": "Yes: the new api pod is Running with 0 restarts."},
    ])
    db.update_token_counts(tip, input_tokens=9_870, output_tokens=512, model="anthropic/claude-sonnet-4",
                           estimated_cost_usd=0.0373, api_call_count=2, billing_provider="openrouter",
                           billing_base_url="https://openrouter.ai/api/v1", billing_mode="chat_completions")
    end(tip, t2 + 120, "user_exit")

    # 2. A delegate the continuation spawned (hidden from the list unless --all).
    t3 = t2 + 60
    child = session(t3, "b7d210", "cli", "openai/gpt-4.1-mini", parent_session_id=tip,
                    model_config={"_delegate_from": tip})
    msgs(child, t3, [
        {"role": "user",
         "content": "Check whether any other deployment in staging uses the old database host 10.0.3.17."},
        {"role": "assistant", "finish_reason": "tool_calls", "content": "",
         "tool_calls": call("call_g1", "search_files", {"pattern": "10.0.3.17", "path": "k8s/staging"})},
        {"role": "tool", "tool_call_id": "call_g1", "tool_name": "search_files",
         "content": "k8s/staging/worker.yaml:41: host: 10.0.3.17"},
        {"role": "assistant", "finish_reason": "stop",
         "content": "The worker deployment still uses 10.0.3.17 (k8s/staging/worker.yaml line 41)."},
    ])
    db.update_token_counts(child, input_tokens=6_020, output_tokens=388, model="openai/gpt-4.1-mini",
                           estimated_cost_usd=0.0030, api_call_count=2, billing_provider="openai",
                           billing_base_url="https://api.openai.com/v1", billing_mode="responses")
    end(child, t3 + 80, "completed")

    # 3. Chinese and Japanese on a messaging gateway, with a web search.
    t4 = now - 5 * 3600
    cjk = session(t4, "c3e5f1", "telegram", "openai/gpt-4.1")
    db.set_session_title(cjk, "分布式系统文章总结")
    msgs(cjk, t4, [
        {"role": "user",
         "content": "帮我总结一下这篇关于分布式系统一致性的文章，重点是 Raft 协议：下周的数据库迁移要用到。"},
        {"role": "assistant", "finish_reason": "tool_calls", "content": "",
         "tool_calls": call("call_w1", "web_search", {"query": "Raft 共识算法 领导者选举 日志复制"})},
        {"role": "tool", "tool_call_id": "call_w1", "tool_name": "web_search",
         "content": "Raft 是一种易于理解的共识算法，分为领导者选举、日志复制和安全性三个部分。"},
        {"role": "assistant", "finish_reason": "stop",
         "content": "文章要点：Raft 通过领导者选举和日志复制实现强一致性；多数派确认后日志才提交。"},
        {"role": "user", "content": "ありがとう。日本語で一文にまとめてください。"},
        {"role": "assistant", "finish_reason": "stop",
         "content": "Raftはリーダー選出とログ複製によって分散システムの一貫性を保つ合意アルゴリズムです。"},
    ])
    db.update_token_counts(cjk, input_tokens=7_450, output_tokens=1_120, model="openai/gpt-4.1",
                           estimated_cost_usd=0.0239, api_call_count=3, billing_provider="openai",
                           billing_base_url="https://api.openai.com/v1", billing_mode="responses")

    # 4. A quick question still open (no end); README's quick start finds and shows it.
    t5 = now - 600
    quick = session(t5, "d90a44", "cli", "anthropic/claude-sonnet-4")
    msgs(quick, t5, [
        {"role": "user", "content": "How do I deploy chat-send to production, in one sentence?"},
        {"role": "assistant", "finish_reason": "stop",
         "content": "Tag the release (git tag chat-send-v2.4.1 && git push --tags); CI builds the image and deploys"
                    " chat-send once the tag's checks pass."},
    ])
    db.update_token_counts(quick, input_tokens=820, output_tokens=61, model="anthropic/claude-sonnet-4",
                           estimated_cost_usd=0.0034, api_call_count=1)

    # 5. A scheduled job from four months ago: what 'prune --older-than-days 90' removes.
    t6 = now - 120 * DAY
    old = session(t6, "e1f2a3", "cron", "openai/gpt-4.1-mini")
    msgs(old, t6, [
        {"role": "user", "content": "Daily report: summarize yesterday's failed CI runs."},
        {"role": "assistant", "finish_reason": "stop", "content": "No CI runs failed yesterday."},
    ])
    db.update_token_counts(old, input_tokens=1_540, output_tokens=40, model="openai/gpt-4.1-mini",
                           estimated_cost_usd=0.0007, api_call_count=1)
    end(old, t6 + 45, "cron_complete")
    return ids


#: state_meta key marking a database written by ``demo`` (so a second run is a no-op).
DEMO_MARKER = "hermes_store.demo"


@click.command()
@global_options
def demo() -> None:
    """Create a demo database with a few sessions.

    Refuses a database that already holds other sessions; on a demo database it
    only says so.
    """
    st = _state()
    if st.path is not None and st.path.exists() and not st.path.is_dir():
        refuse_unadopted(st.path)
    with session_db(st, create=True) as db:
        existing = db.session_count(include_archived=True)  # archived sessions are data too
        already = existing and db.get_meta(DEMO_MARKER) is not None
        if existing and not already:
            raise CliError(
                f"{st.where} already holds {existing} session(s); demo only writes into a new or empty database"
            )
        if not already:
            db.set_meta(DEMO_MARKER, "1")
            ids = write_demo(db)
        else:  # running the README's first command twice is fine
            ids = [r["id"] for r in db.search_sessions(limit=1000)]
        doc = {"db": st.where, "sessions": db.session_count(include_archived=True), "messages": db.message_count(),
               "session_ids": ids, "created": not already}
    if st.json:
        st.emit(doc)
        return
    out = stdout_console()
    verb = "written to" if not already else "already in"
    out.print(Text(f"Demo database {verb} {st.where}: {doc['sessions']} sessions, {doc['messages']} messages."))
    out.print(Text("Next: sessions, show ID, lineage ID, search kubernetes, search 一致性, stats", style="dim"))


COMMANDS = (upgrade, current, adopt, demo)
