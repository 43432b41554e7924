"""``hermes-store retention``: the store's retention policies (show, set) and applying
them (apply, ``--dry-run`` first). The work is :mod:`hermes_store.operations.retention`'s;
the policies live in the store (revision hs0009), per tenant schema on a server, and the
auto-maintenance (``maybe_auto_prune_and_vacuum``) applies them too."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click
from rich.text import Text

from ..keys import RETENTION_DEFAULT_SOURCE
from ..operations.retention import RetentionReport, apply_retention
from ..repositories.retention import MAX_DAYS, RetentionPolicyRecord, RetentionRepository
from ..sessiondb._host import HostSteps
from ._base import shown
from ._common import (
    TEXT,
    _state,
    fitted_table,
    fmt_bytes,
    fmt_num,
    global_options,
    read,
    session_db,
    stdout_console,
)

#: What ``--delete-after-days`` / ``--redact-after-days`` take for "never".
NEVER = "never"


class Age(click.ParamType):
    """A number of days (``30``, ``0.5``) from 0 to 100,000, or ``never``."""

    name = "days"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        raw = str(value).strip().lower()
        if raw in (NEVER, "off", "none"):
            return NEVER
        if not re.fullmatch(r"[0-9]{1,6}(\.[0-9]{1,6})?", raw) or float(raw) > MAX_DAYS:
            self.fail(f"{shown(str(value))} is not a number of days from 0 to {MAX_DAYS:,.0f} (or 'never')",
                      param, ctx)
        return float(raw)


AGE = Age()


def _days(value: float | None) -> str:
    return NEVER if value is None else f"{value:g} d"


def _source(name: str | None) -> str:
    return RETENTION_DEFAULT_SOURCE if name in (None, "default", RETENTION_DEFAULT_SOURCE) else str(name)


def _policy_rows(policies: list[RetentionPolicyRecord]) -> list[list[str]]:
    return [["default (*)" if p.is_default else p.source, _days(p.delete_after_days), _days(p.redact_after_days),
             "included" if p.include_pinned else "kept", "included" if p.include_user_titled else "kept",
             p.archive_dir or "—"] for p in policies]


_HEAD = ["Source", "Delete ended", "Redact", "Pinned", "User-titled", "Archive to"]


@click.group(no_args_is_help=False)
@global_options
def retention() -> None:
    """Retention policies per source: show, set, apply (--dry-run)."""


@retention.command("show")
@global_options
def retention_show() -> None:
    """Show the store's retention policies (the default, '*', covers every other source)."""
    st = _state()
    with session_db(st) as db:
        policies = read(db, lambda c: RetentionRepository(c).policies())
    if st.json:
        st.emit({"policies": [p.as_dict() for p in policies]})
        return
    out = stdout_console()
    if not policies:
        out.print(Text("No retention policy: everything is kept (set one with 'retention set')."))
        return
    out.print(fitted_table(out, _HEAD, _policy_rows(policies), flex=5))


@retention.command("set")
@click.option("--source", type=TEXT, metavar="SRC",
              help="The source the policy is for (cli, telegram...); 'default' or '*' (the default) for every "
                   "source without a policy of its own.")
@click.option("--delete-after-days", "delete_days", type=AGE, metavar="N|never",
              help="Delete sessions that ended more than N days ago.")
@click.option("--redact-after-days", "redact_days", type=AGE, metavar="N|never",
              help="Replace tool outputs and reasoning of messages older than N days with a short marker.")
@click.option("--include-pinned/--keep-pinned", default=None,
              help="Whether the policy touches pinned sessions (kept by default).")
@click.option("--include-user-titled/--keep-user-titled", default=None,
              help="Whether it touches sessions a person titled (kept by default).")
@click.option("--archive-dir", type=TEXT, metavar="DIR|none",
              help="Write deleted sessions there first, as JSON Lines ('none': no archive).")
@click.option("--remove", is_flag=True, help="Remove the policy of this source instead.")
@global_options
def retention_set(source: str | None, delete_days: Any, redact_days: Any, include_pinned: bool | None,
                  include_user_titled: bool | None, archive_dir: str | None, remove: bool) -> None:
    """Create or change the retention policy of one source (only the options given change)."""
    st = _state()
    key = _source(source)
    changes: dict[str, Any] = {}
    if delete_days is not None:
        changes["delete_after_days"] = None if delete_days == NEVER else delete_days
    if redact_days is not None:
        changes["redact_after_days"] = None if redact_days == NEVER else redact_days
    if include_pinned is not None:
        changes["include_pinned"] = include_pinned
    if include_user_titled is not None:
        changes["include_user_titled"] = include_user_titled
    if archive_dir is not None:
        if archive_dir.lower() == "none":
            changes["archive_dir"] = None
        else:
            folder = Path(archive_dir).expanduser()
            if not folder.is_dir():
                raise click.BadParameter(f"folder {shown(archive_dir)} does not exist", param_hint="--archive-dir")
            changes["archive_dir"] = str(folder.resolve())
    if remove and changes:
        raise click.UsageError("--remove takes no other policy option")
    if not remove and not changes:
        raise click.UsageError("nothing to set: give --delete-after-days, --redact-after-days, --archive-dir, "
                               "--include-pinned or --include-user-titled (or --remove)")
    with session_db(st, write=True) as db:
        steps = HostSteps(db)
        if remove:
            removed = steps.write(lambda c: RetentionRepository(c).remove_policy(key))
            doc: dict[str, Any] = {"source": key, "removed": removed}
        else:
            policy = steps.write(lambda c: RetentionRepository(c).set_policy(key, **changes))
            doc = {"policy": policy.as_dict()}
    if st.json:
        st.emit(doc)
        return
    out = stdout_console()
    if remove:
        out.print(Text(f"Removed the policy of {key}." if doc["removed"] else f"No policy of {key} to remove."))
        return
    out.print(fitted_table(out, _HEAD, _policy_rows([policy]), flex=5))


@retention.command("apply")
@click.option("--dry-run", is_flag=True, help="Show what would go, per policy; change nothing.")
@click.option("--sessions-dir", type=click.Path(file_okay=False, exists=True, path_type=Path), metavar="DIR",
              help="Also remove deleted sessions' transcript files (<id>.json, <id>.jsonl...) here.")
@global_options
def retention_apply(dry_run: bool, sessions_dir: Path | None) -> None:
    """Apply the retention policies now, in short batches (each its own transaction).

    Deleted sessions go with their messages (an archive is written and
    fsynced first when the policy names a folder); redacted messages keep
    their row, ids and token counts. Try --dry-run first.
    """
    st = _state()
    with session_db(st, write=not dry_run) as db:
        steps = HostSteps(db)
        report = apply_retention(steps, dry_run=dry_run, sessions_dir=sessions_dir)
    if st.json:
        st.emit(report.as_dict())
        return
    _print_report(report)


def _print_report(report: RetentionReport) -> None:
    out = stdout_console()
    if not report.policies:
        out.print(Text("No retention policy: nothing to apply (set one with 'retention set')."))
        return
    verb = "Would" if report.dry_run else "Did"
    rows = []
    for p in report.policies:
        deleted = "—" if p.delete_after_days is None else (
            f"{fmt_num(p.sessions_deleted)} sessions, {fmt_num(p.messages_deleted)} msgs"
            + (f", {fmt_bytes(p.bytes_deleted)}" if p.bytes_deleted is not None else ""))
        redacted = "—" if p.redact_after_days is None else (
            f"{fmt_num(p.tool_outputs_redacted)} tool outputs, {fmt_num(p.reasoning_redacted)} reasoning"
            + (f", {fmt_bytes(p.bytes_redacted)}" if p.bytes_redacted is not None else ""))
        rows.append(["default (*)" if p.source == RETENTION_DEFAULT_SOURCE else p.source, deleted, redacted])
    out.print(fitted_table(out, ["Policy", f"{verb} delete", f"{verb} redact"], rows, flex=0))
    for p in report.policies:
        if p.archive:
            out.print(Text(f"{p.source}: {fmt_num(p.archived_sessions)} session(s) archived to {p.archive}",
                           style="dim"))
    if report.dry_run:
        out.print(Text("Dry run: nothing was changed (bytes are estimates of the stored text).", style="dim"))


COMMANDS = (retention,)
