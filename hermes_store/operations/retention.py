"""Retention: apply a store's policies (hs0009) in batches, each its own transaction.

For each policy (:mod:`hermes_store.repositories.retention` says whom it covers and
what it does), first the deletions, then the redactions:

* deletion, :data:`~hermes_store.keys.RETENTION_DELETE_BATCH` sessions a batch: a read
  step picks the next sessions (and, when the policy has an ``archive_dir``, reads them
  as ``hermes-store export`` writes them); the archive lines are written and fsynced;
  then one write step deletes those still due (checked again there, so a session
  resumed or pinned meanwhile stays; the archive may then hold a session that was kept).
  Nothing is deleted before its archive line is on disk.
* redaction, :data:`~hermes_store.keys.RETENTION_REDACT_BATCH` messages a batch: a read
  step finds the next message ids (in id order, so a pass ends), one write step
  replaces what is still due.

So the write lock is held for one batch at a time, never for a scan; other writers get
it between two batches. A dry run reads only: per policy, the sessions, messages and
estimated bytes deletion would remove and the rows and bytes redaction would replace.
"""

from __future__ import annotations

import os
import re
import time as _time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Sequence

from sqlalchemy import Connection

from .. import errors, paths
from ..codec import jsonl_line
from ..keys import RETENTION_DELETE_BATCH, RETENTION_REDACT_BATCH
from ..repositories.retention import RetentionPolicyRecord, RetentionRepository
from .steps import Steps

#: Below every message id: where a redaction pass starts.
_FIRST_ID = -(2**62)


@dataclass
class PolicyOutcome:
    """What one policy removed (or, in a dry run, would remove)."""

    source: str
    delete_after_days: float | None
    redact_after_days: float | None
    sessions_deleted: int = 0
    messages_deleted: int = 0
    bytes_deleted: int | None = None     # estimated; a dry run's only
    tool_outputs_redacted: int = 0
    reasoning_redacted: int = 0
    bytes_redacted: int | None = None    # estimated; a dry run's only
    archive: str | None = None
    archived_sessions: int = 0
    batches: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RetentionReport:
    """The outcome of :func:`apply_retention`: one entry per policy, and the totals."""

    dry_run: bool
    policies: list[PolicyOutcome] = field(default_factory=list)
    seconds: float = 0.0

    def total(self, name: str) -> int:
        return sum(int(getattr(p, name) or 0) for p in self.policies)

    @property
    def changed(self) -> bool:
        return any(self.total(n) for n in ("sessions_deleted", "tool_outputs_redacted", "reasoning_redacted"))

    def as_dict(self) -> dict[str, Any]:
        names = ("sessions_deleted", "messages_deleted", "tool_outputs_redacted", "reasoning_redacted")
        doc: dict[str, Any] = {"dry_run": self.dry_run, "policies": [p.as_dict() for p in self.policies],
                               "seconds": round(self.seconds, 3)}
        doc.update({n: self.total(n) for n in names})
        if self.dry_run:
            doc.update(bytes_deleted=self.total("bytes_deleted"), bytes_redacted=self.total("bytes_redacted"))
        return doc


def _others(policies: Sequence[RetentionPolicyRecord]) -> list[str]:
    """The sources with a policy of their own (the default covers every other one)."""
    return [p.source for p in policies if not p.is_default]


# ---------------------------------------------------------------------------- the archive


class Archive:
    """A new JSON Lines file of deleted sessions, owner-only, appended batch by batch:
    each batch is written and fsynced (the folder too, once, after the file appeared)
    before the sessions it holds are deleted."""

    def __init__(self, folder: Path, label: str, now: float) -> None:
        stamp = _time.strftime("%Y%m%dT%H%M%SZ", _time.gmtime(now))
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", label) or "store"
        for n in range(1000):
            path = folder / f"retention-{safe}-{stamp}{'' if n == 0 else f'-{n}'}.jsonl"
            try:
                # O_EXCL: a name nobody had a moment ago (never a store, never a store's -wal).
                self._fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC, 0o600)
            except FileExistsError:
                continue
            except OSError as exc:
                raise errors.InvalidInputError(f"cannot create the retention archive in {folder}: {exc}") from exc
            break
        else:
            raise errors.InvalidInputError(f"cannot create the retention archive in {folder}: too many files")
        self.path = path
        self.sessions = 0
        paths.fsync_dir(folder)

    def write(self, records: Sequence[dict[str, Any]]) -> None:
        data = "".join(jsonl_line(r) + "\n" for r in records).encode("utf-8")
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        os.fsync(self._fd)
        self.sessions += len(records)

    def close(self) -> None:
        os.close(self._fd)


def archive_folder(policy: RetentionPolicyRecord) -> Path | None:
    """The policy's archive folder, checked before anything is deleted (InvalidInputError)."""
    if policy.archive_dir is None:
        return None
    folder = Path(policy.archive_dir).expanduser()
    if not folder.is_dir():
        raise errors.InvalidInputError(
            f"retention policy {policy.source!r}: archive folder {policy.archive_dir} does not exist")
    return folder


# ---------------------------------------------------------------------------- the work


def _delete(steps: Steps, policy: RetentionPolicyRecord, others: list[str], protected: frozenset[str],
            out: PolicyOutcome, batch: int, sessions_dir: Path | None, pause: float) -> None:
    folder = archive_folder(policy)
    archive: Archive | None = None
    after: tuple[float, str] | None = None
    try:
        while True:
            def pick(c: Connection, after: tuple[float, str] | None = after
                     ) -> tuple[list[str], tuple[float, str] | None, list[dict[str, Any]]]:
                repo = RetentionRepository(c)
                ids, last = repo.sessions_to_delete(policy, others, batch, protected, after)
                return ids, last, (repo.export(ids) if folder is not None else [])

            ids, after, records = steps.read(pick)
            if after is None:
                return
            if not ids:
                continue  # a page of protected sessions only
            if folder is not None:
                if archive is None:
                    archive = Archive(folder, f"{steps.schema or 'store'}-{_label(policy)}", steps.now())
                    out.archive = str(archive.path)
                archive.write(records)
                out.archived_sessions = archive.sessions
            def remove(c: Connection, ids: list[str] = ids) -> tuple[list[str], int]:
                return RetentionRepository(c).delete_sessions(ids, policy, others, sessions_dir)

            gone, messages = steps.write(remove)
            out.sessions_deleted += len(gone)
            out.messages_deleted += messages
            out.batches += 1
            if pause:
                steps.sleep(pause)
    finally:
        if archive is not None:
            archive.close()


def _redact(steps: Steps, policy: RetentionPolicyRecord, others: list[str], protected: frozenset[str],
            out: PolicyOutcome, batch: int, pause: float) -> None:
    after = _FIRST_ID
    while True:
        def pick(c: Connection, after: int = after) -> tuple[list[int], int | None]:
            return RetentionRepository(c).messages_to_redact(policy, others, after, batch, protected)

        ids, last = steps.read(pick)
        if last is None:
            return
        after = last
        if not ids:
            continue  # a page of protected sessions' rows only

        def replace(c: Connection, ids: list[int] = ids) -> tuple[int, int]:
            return RetentionRepository(c).redact(ids, policy, others)

        tools, reasoning = steps.write(replace)
        out.tool_outputs_redacted += tools
        out.reasoning_redacted += reasoning
        out.batches += 1
        if pause:
            steps.sleep(pause)


def _label(policy: RetentionPolicyRecord) -> str:
    return "default" if policy.is_default else policy.source


def retention_plan(steps: Steps, policies: Sequence[RetentionPolicyRecord] | None = None) -> RetentionReport:
    """What :func:`apply_retention` would do now, per policy, in one read (nothing changes)."""
    started = steps.monotonic()

    def plan(c: Connection) -> list[PolicyOutcome]:
        repo = RetentionRepository(c)
        found = repo.policies() if policies is None else list(policies)
        others = _others(found)
        outs = []
        for p in found:
            out = PolicyOutcome(p.source, p.delete_after_days, p.redact_after_days)
            protected = repo.protected(p)
            if p.delete_after_days is not None:
                d = repo.estimate_delete(p, others, protected)
                out.sessions_deleted, out.messages_deleted, out.bytes_deleted = d.sessions, d.messages, d.bytes
            if p.redact_after_days is not None:
                r = repo.estimate_redact(p, others, protected)
                out.tool_outputs_redacted, out.reasoning_redacted = r.tool_outputs, r.reasoning
                out.bytes_redacted = r.tool_bytes + r.reasoning_bytes
            outs.append(out)
        return outs

    report = RetentionReport(dry_run=True, policies=steps.read(plan))
    report.seconds = steps.monotonic() - started
    return report


def apply_retention(
    steps: Steps,
    *,
    dry_run: bool = False,
    sessions_dir: Path | None = None,
    policies: Sequence[RetentionPolicyRecord] | None = None,
    delete_batch: int = RETENTION_DELETE_BATCH,
    redact_batch: int = RETENTION_REDACT_BATCH,
    pause: float = 0.0,
) -> RetentionReport:
    """Apply the store's retention policies (or ``policies``); see the module docstring.

    ``sessions_dir``: the transcript files of deleted sessions go too (as a prune's).
    ``pause``: seconds between two batches (0: none; the lock is free between them
    anyway). Raises on the first failure (a typed error; a held lock past the write
    budget is DatabaseLockedError): the batches before it stay committed and the next
    run goes on where this one stopped. A missing archive folder is refused before
    that policy deletes anything.
    """
    if dry_run:
        return retention_plan(steps, policies)
    if delete_batch < 1 or redact_batch < 1:
        raise errors.InvalidInputError("retention batches need at least one row")
    started = steps.monotonic()
    found = list(policies) if policies is not None else steps.read(lambda c: RetentionRepository(c).policies())
    others = _others(found)
    report = RetentionReport(dry_run=False)
    for p in found:
        archive_folder(p)  # every policy's folder checked before any of them deletes
    for p in found:
        out = PolicyOutcome(p.source, p.delete_after_days, p.redact_after_days)
        report.policies.append(out)
        if p.delete_after_days is None and p.redact_after_days is None:
            continue
        # Read once per policy: a session protected only through a continuation pinned
        # during the run is the one race left (its own row is checked again each batch).
        def kept(c: Connection, p: RetentionPolicyRecord = p) -> frozenset[str]:
            return RetentionRepository(c).protected(p)

        protected = steps.read(kept)
        if p.delete_after_days is not None:
            _delete(steps, p, others, protected, out, delete_batch, sessions_dir, pause)
        if p.redact_after_days is not None:
            _redact(steps, p, others, protected, out, redact_batch, pause)
    report.seconds = steps.monotonic() - started
    return report


__all__ = [
    "Archive",
    "PolicyOutcome",
    "RetentionReport",
    "apply_retention",
    "archive_folder",
    "retention_plan",
]
