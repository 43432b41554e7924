"""Copy a whole history from one store to another: SQLite ↔ PostgreSQL, SQLite ↔ SQLite,
PostgreSQL ↔ PostgreSQL (``hermes-store copy --from SRC --to DST``).

Written for someone moving years of sessions to a server (or back to a ``state.db``
that Hermes opens): nothing is lost, the source is never written, a kill at any point
costs only the batch in flight, and the result is checked before it is called done.

**The source is only read.** A SQLite file at our newest revision is opened read-only
(``mode=ro``; sidecars a reader had to create are removed again, see
:func:`hermes_store.paths.readonly_connection`). A file Hermes wrote and nobody adopted
yet, or one at an older revision of ours, is copied with SQLite's backup API into a
private work folder (next to a file destination, else the system's temporary folder,
or ``work_dir``) and that copy is adopted or upgraded; the work folder is removed
afterwards (and, if a kill left one behind, by the next run). A server is read in one
``SERIALIZABLE READ ONLY DEFERRABLE`` transaction. Either way every read of one run
sees one snapshot, so a copy of a store Hermes keeps writing is still consistent. (A
copy killed while it reads a WAL-mode file that had no ``-wal`` leaves the empty
``-wal``/``-shm`` a reader has to create; the database's own bytes are untouched, and
SQLite removes the two at Hermes' next close.)

**Streamed.** Sessions are read in keyset pages of their id; each page's messages come
through one streamed cursor ordered by ``(session_id, id)``, and every other table in
keyset pages of its primary key. Memory holds one page and one batch, whatever the size.

**Resumable and idempotent.** The unit of work is a session: its row, all its messages
and its usage ledger go into the destination in one transaction (sessions are grouped
until a transaction holds ``batch`` messages; a session larger than that streams into
one transaction of its own). So a session present in the destination is complete, and
a later run simply skips it, as ``import`` skips sessions already there. Rows of the
other tables are inserted when the destination lacks their key (looked up first, with
``ON CONFLICT DO NOTHING`` as the guard). A marker in the
destination's ``state_meta`` (:data:`MARKER_KEY`) names the source, says whether the
copy finished and carries the parent links still waiting for their parent; it is
written in the same transaction as the rows it describes. Killed at any point and run
again, a copy finishes with no gaps and no duplicates; run again after it finished, it
changes nothing. (A destination written to since, by Hermes or by hand, no longer
matches: a later run says which sessions differ, and copies only what is missing.)

**Lineage.** A child whose parent is not in the destination yet is inserted unlinked and
its link restored in the transaction that brings the parent (the pending links live in
the marker, so this survives a kill). A link to a session the source does not have at
all (a dangling reference an old file can hold) cannot be stored under a foreign key:
it is dropped and reported, as is a ``system_prompt_hash`` without its prompt.

**Every column, ids included.** Rows are copied as stored (no decoding and re-encoding),
message ids are kept, so anchors and exports stay valid, and NULLs stay NULL even where
a trigger or a column default would fill them in (``display_order`` pending Hermes'
backfill). The destination's message-id counter is moved past every id the source
ever handed out, its deleted newest messages' included (SQLite's ``sqlite_sequence``,
PostgreSQL's identity), so no id ever names two different messages.

**One copy into a store at a time.** A second copy into a destination another copy is
writing is refused at once with :class:`CopyInProgressError`, writing nothing: ``flock``
on ``<file>.copy-lock`` beside a file; on a server, a transaction-level advisory lock
per database and schema, held by a connection whose transaction stays open for the run
(so behind a transaction pooler it keeps its server connection, and nothing of it stays
on that connection afterwards). Both locks die with a killed holder, so a resume is
never blocked (a killed copy's empty lock file stays until the next run removes it).

What is copied, and why the rest is not:

* ``sessions``, ``messages``, ``session_model_usage``, ``system_prompts``: the history.
* ``gateway_routing`` (which session a chat continues), ``gateway_hygiene_state`` (a
  chat's failure streak, kept across restarts), ``async_delegations`` (sub-agent results
  still to deliver) and ``conversation_generations`` (a counter that must never go
  back: on a merge the larger value wins): durable state that belongs to the history.
* ``state_meta``, except per-file bookkeeping that describes the source file's own
  indexes or schedule and would be wrong, or harmful, in another database: the FTS
  rebuild window (``fts_rebuild_high_water``/``fts_rebuild_progress``: the
  destination's FTS triggers would skip every message inside it), the v28
  ``fts_tool_full_content_high_water``, the short-CJK index's high-water mark (the
  destination builds its own index), ``last_auto_prune`` (the destination's own prune
  schedule) and this copy's own markers. Every other key, Hermes' and ours, is copied.
* Not copied: ``compression_locks`` and ``session_turn_leases`` (leases held for seconds
  by processes running against the source), ``gateway_heartbeats`` (liveness of the
  gateways serving the source), ``schema_version`` and ``hermes_store_version`` (the
  destination's migrations write its own), the short-CJK index tables (rebuilt from the
  copied messages), and tables or columns hermes_store does not model (reported).

**Encrypted files.** Either side may be an encrypted SQLite file (SQLCipher, see
:mod:`hermes_store.encryption`), the other plain, encrypted with another key, or a
server: each file side has its own key (``source_key``/``destination_key``, or the
``sqlite://:<key>@/<path>`` URL's password part, else the environment's, as for every
store opened by path; see :mod:`.endpoints`). A keyed file is
opened only through SQLCipher with its key, checked before anything is written (a
wrong or missing key: :class:`~hermes_store.errors.EncryptionKeyError`, nothing
written); an encrypted destination is created encrypted from its first byte, and a
work copy of an encrypted source is encrypted with the source's key: no plaintext of
an encrypted side ever reaches the disk.

**Destination.** Created (a file 0600) or migrated to head by
:func:`hermes_store.migrations.upgrade`. One that already holds data is refused, with
nothing written, unless ``merge=True``; then id clashes go as in ``import``: a session
already there is kept as it is (with its messages), a copied session keeps its message
ids when all are free and gets new ones in the same order otherwise, and a title
already taken gets the next free ``"title #N"``. The copy's own unfinished run is not
"other data": running the same copy again resumes it.

**Search.** A SQLite destination's FTS5 triggers index each message as it arrives; a
server's generated ``tsvector`` and trigram index do the same. Afterwards the short-CJK
index is brought up to date and every full-text index is checked (and rebuilt if the
check fails), so the destination searches exactly like a store written all along.

**Verified.** Row counts per table on both sides, and per session a SHA-256 of its row,
its usage ledger and its messages' content, plus one of the message ids. A session
that differs is named; outside a merge any difference fails the copy
(:class:`CopyVerificationError`, exit code 1 on the command line). With ``merge`` a
difference in a session the destination already had is reported as kept.

The package, one module per step: :mod:`.plan` (what travels, the report, the errors),
:mod:`.endpoints` (parsing both sides), :mod:`.source` (reading without writing),
:mod:`.destination` (may this run write there?), :mod:`.copier` (the copy and the index
upkeep), :mod:`.verify` (the check), over :mod:`.rows` (row reads both sides share).
"""

from __future__ import annotations

import os
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from sqlalchemy.engine import URL

from .. import encryption, errors, migrations, paths
from ..adopt import finish_interrupted
from ..dialects import for_connection
from .copier import Copier
from .destination import decide, destination_lock, inspect_destination, writer_engine
from .endpoints import check_keys, endpoints, refuse_same
from .plan import (
    DEFAULT_BATCH,
    MARKER_KEY,
    MAX_BATCH,
    CopyError,
    CopyInProgressError,
    CopyReport,
    CopyVerificationError,
    DestinationNotEmptyError,
    Progress,
    meta_key_copied,
)
from .source import source_engine

__all__ = [
    "DEFAULT_BATCH",
    "MARKER_KEY",
    "MAX_BATCH",
    "CopyError",
    "CopyInProgressError",
    "CopyReport",
    "CopyVerificationError",
    "DestinationNotEmptyError",
    "copy_history",
    "meta_key_copied",
]


def _quiet(_stage: str, _done: int, _total: int | None) -> None:
    return None


def copy_history(
    src: str | os.PathLike[str] | URL,
    dst: str | os.PathLike[str] | URL,
    *,
    merge: bool = False,
    progress: Progress | None = None,
    batch: int = DEFAULT_BATCH,
    work_dir: str | os.PathLike[str] | None = None,
    source_key: encryption.KeyLike | None = None,
    destination_key: encryption.KeyLike | None = None,
) -> CopyReport:
    """Copy every session, message and the rest of the history from ``src`` to ``dst``.

    Each side is a SQLite file path (or ``sqlite:///`` URL) or a ``postgresql+psycopg://``
    URL. See the module docstring for what is copied, how the source stays untouched,
    and how a killed copy resumes. ``progress(stage, done, total)`` is called after every
    destination transaction (stages: ``snapshot``, ``adopt:*``, a table name,
    ``sessions``, ``index``, ``verify``). ``batch`` bounds the messages (and rows of the
    other tables) per transaction. ``work_dir`` is where an unadopted source file is
    adopted in a temporary copy (default: the destination file's folder, else the
    system's temporary folder).

    ``source_key``/``destination_key``: an encrypted file side's key (a passphrase or
    ``x'<64 hex>'``; also taken from a ``sqlite://:<key>@/<path>`` URL); a file side
    given none takes ``$HERMES_STORE_KEY``/``$HERMES_STORE_KEY_FILE``'s, as every store
    opened by path does, and is plain without one. A key for a server side is refused.

    Returns the :class:`CopyReport`. Raises typed errors before writing anything for bad
    arguments, an unreadable source and a destination that holds other data without
    ``merge`` (:class:`DestinationNotEmptyError`); raises :class:`CopyVerificationError`
    (its ``report`` attached) when the finished copy does not match the source.
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise errors.InvalidInputError(f"batch must be a whole number from 1 to {MAX_BATCH:,}, not {batch!r}")
    progress = progress or _quiet
    source, target = endpoints(src, dst, source_key, destination_key)
    refuse_same(source, target)
    check_keys(source, target)  # a wrong or missing key on either side: refused, nothing written
    source_label = str(Path(os.path.realpath(source.path))) if source.path is not None else source.label
    report = CopyReport(source=source_label, destination=target.label, merge=merge)
    started = time.monotonic()
    with ExitStack() as stack:
        stack.enter_context(destination_lock(target))  # one copy into a store at a time
        state = inspect_destination(target)
        marker = decide(state, source_label, merge, report)
        report.merge = bool(marker.get("merge"))
        if work_dir is not None:
            folder = Path(work_dir)
        elif target.path is not None:
            folder = Path(os.path.realpath(target.path)).parent
        else:
            folder = Path(tempfile.gettempdir())
        clock = time.monotonic()
        src_engine = stack.enter_context(source_engine(source, folder, progress, report))
        src_conn = stack.enter_context(paths.connect(src_engine))
        src_conn.execution_options(postgresql_readonly=True, postgresql_deferrable=True)
        src_conn.begin()  # one snapshot for the whole run
        report.seconds["open_source"] = round(time.monotonic() - clock, 3)
        clock = time.monotonic()
        if target.key is not None:
            # Never adopted (a Hermes file is plain): an interrupted encrypt/rekey swap is
            # finished first, as SessionDB does, then the keyed file created or migrated.
            finish_interrupted(paths.resolve_link(target.path))  # type: ignore[arg-type]
            migrations.upgrade(target.keyed_url)
        else:
            migrations.upgrade(target.path if target.path is not None else target.url)  # type: ignore[arg-type]
        dst_engine = writer_engine(target)
        stack.callback(dst_engine.dispose)
        dst_conn = stack.enter_context(paths.connect(dst_engine))
        dst_conn.execution_options(**for_connection(dst_conn).begin_options(True))
        report.seconds["open_destination"] = round(time.monotonic() - clock, 3)
        Copier(src_conn, dst_conn, report, marker, batch=batch, progress=progress).run()
    report.seconds["total"] = round(time.monotonic() - started, 3)
    if not report.ok:
        raise CopyVerificationError(_mismatch_line(report), report)
    return report


def _mismatch_line(report: CopyReport) -> str:
    parts = []
    if report.mismatched_sessions:
        names = ", ".join(repr(s) for s in report.mismatched_sessions[:10])
        more = f" and {len(report.mismatched_sessions) - 10} more" if len(report.mismatched_sessions) > 10 else ""
        parts.append(f"{len(report.mismatched_sessions)} session(s) differ from the source: {names}{more}")
    if report.mismatched_rows:
        parts.append("rows differ in " + ", ".join(f"{t} ({n})" for t, n in sorted(report.mismatched_rows.items())))
    return f"the copy in {report.destination} does not match {report.source}: " + "; ".join(parts)
