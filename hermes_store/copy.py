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
backfill). On PostgreSQL the identity of ``messages.id`` is moved past the copied ids.

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
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import tempfile
import time
from collections import defaultdict
from contextlib import ExitStack, closing, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from sqlalchemy import Connection, Engine, event, exists, func, insert, inspect, literal, select, text, tuple_, update
from sqlalchemy.engine import URL, make_url
from sqlalchemy import table as sa_table
from sqlalchemy.pool import StaticPool

from . import adopt, errors, migrations, paths
from .adopt.work import FTS_BOOKKEEPING_KEYS
from .dialects import for_connection
from .dialects.sqlite import FTS_SHADOWS
from .engine import create_engine
from .models import Base
from .repositories.base import ID_CHUNK
from .repositories.maintenance import MaintenanceRepository
from .repositories.messages import MessageRepository
from .repositories.sessions import SessionRepository
from .search import bigram
from .titles import split_title_number

__all__ = [
    "DEFAULT_BATCH",
    "MARKER_KEY",
    "CopyError",
    "CopyReport",
    "CopyVerificationError",
    "DestinationNotEmptyError",
    "copy_history",
    "meta_key_copied",
]

#: Messages per destination transaction (and rows per page of the smaller tables).
DEFAULT_BATCH = 1000
MAX_BATCH = 100_000
#: ``state_meta`` key of the copy's marker (JSON); see the module docstring.
MARKER_KEY = "hermes_store.copy"
MARKER_FORMAT = 1
#: Prefix of the private work folders holding an adopted copy of a source file.
WORK_PREFIX = ".hermes-store-copy-"
#: Free space a work copy needs, in source sizes: the copy, and adoption's own copy of it.
WORK_SPACE_FACTOR = 3
#: Rows of the short-CJK index caught up per destination transaction.
INDEX_CHUNK = 20_000
#: How many names a report lists before it only counts.
LISTED = 50

Progress = Callable[[str, int, "int | None"], None]

#: Copied before the sessions, which point at them.
BEFORE_SESSIONS = ("system_prompts",)
#: Copied after the sessions, each on its own primary key.
AFTER_SESSIONS = ("gateway_routing", "gateway_hygiene_state", "conversation_generations", "async_delegations",
                  "state_meta")
SESSION_TABLES = ("sessions", "messages", "session_model_usage")
COPIED_TABLES = (*BEFORE_SESSIONS, *SESSION_TABLES, *AFTER_SESSIONS)
#: Tables left out on purpose, with the reason a report gives.
NOT_COPIED = {
    "schema_version": "written by the destination's own migrations",
    paths.VERSION_TABLE: "written by the destination's own migrations",
    "compression_locks": "short leases held by processes running against the source",
    "session_turn_leases": "short leases held by processes running against the source",
    "gateway_heartbeats": "liveness of the gateways serving the source",
    bigram.TABLE: "a search index, rebuilt from the copied messages",
    bigram.DIRTY_TABLE: "a search index, rebuilt from the copied messages",
}
#: Not copied and not worth a line in a report: rewritten or rebuilt on the destination.
_SILENT = frozenset({"schema_version", paths.VERSION_TABLE, bigram.TABLE, bigram.DIRTY_TABLE})
#: ``state_meta`` keys describing the source file itself (see the module docstring).
PER_FILE_META_KEYS = frozenset({*FTS_BOOKKEEPING_KEYS, bigram.HIGH_WATER_KEY, "last_auto_prune"})
#: On a merge a generation counter only moves up (Hermes never lets one go back).
_UPSERT_UPDATES = {
    "conversation_generations":
        "generation = excluded.generation WHERE excluded.generation > conversation_generations.generation",
}
#: Python's side of the same rule: whether a source row should replace the destination's.
_NEWER: dict[str, Callable[[dict[str, Any], dict[str, Any]], bool]] = {
    "conversation_generations": lambda src, dst: (src.get("generation") or 0) > (dst.get("generation") or 0),
}
_TABLES = Base.metadata.tables
S, M, U, P = (_TABLES[n] for n in ("sessions", "messages", "session_model_usage", "system_prompts"))


def meta_key_copied(key: Any) -> bool:
    """Whether a ``state_meta`` key travels with the history (see the module docstring)."""
    if not isinstance(key, str):
        return False
    return key not in PER_FILE_META_KEYS and key != MARKER_KEY and not key.startswith(MARKER_KEY + ".")


# ---------------------------------------------------------------------------- errors and report


class CopyError(errors.HermesStoreError):
    """A copy that cannot start or finish as asked."""


class DestinationNotEmptyError(CopyError):
    """The destination already holds data and ``merge`` was not given; nothing was written."""


class CopyVerificationError(CopyError):
    """The copy finished but the destination does not match the source; ``report`` says where."""

    def __init__(self, message: str, report: "CopyReport") -> None:
        super().__init__(message)
        self.report = report


@dataclass
class CopyReport:
    """What a copy did and what its verification found."""

    source: str
    destination: str
    merge: bool = False
    #: This run carried on an unfinished copy of the same source.
    resumed: bool = False
    #: The destination held a finished copy of this source already.
    already_complete: bool = False
    source_revision: str | None = None
    #: The source was read through an adopted (or upgraded) work copy of it.
    source_work_copy: bool = False
    sessions_copied: int = 0
    #: Source sessions whose id the destination already had (kept as they were there).
    sessions_present: int = 0
    messages_copied: int = 0
    #: Copied sessions whose message ids were taken, so they got new ones (merge).
    renumbered_sessions: list[str] = field(default_factory=list)
    #: (session, title in the source, title given) where the title was taken (merge).
    renamed_titles: list[tuple[str, str, str]] = field(default_factory=list)
    #: (session, parent) links to a session that exists on neither side: dropped.
    dropped_links: list[tuple[str, str]] = field(default_factory=list)
    #: (session, hash) prompt references without their prompt: dropped.
    dropped_prompts: list[tuple[str, str]] = field(default_factory=list)
    #: Rows that cannot be copied, per table (a NULL key, a message of a missing session).
    not_copyable: dict[str, int] = field(default_factory=dict)
    #: Rows per table: {"source": n, "destination": m} (state_meta: keys that travel).
    tables: dict[str, dict[str, int]] = field(default_factory=dict)
    skipped_tables: dict[str, str] = field(default_factory=dict)
    skipped_columns: dict[str, list[str]] = field(default_factory=dict)
    skipped_meta_keys: list[str] = field(default_factory=list)
    #: Rows the short-CJK index caught up on.
    indexed_rows: int = 0
    #: Full-text index → None when healthy, else the problem (after any rebuild).
    search_indexes: dict[str, str | None] = field(default_factory=dict)
    rebuilt_indexes: list[str] = field(default_factory=list)
    verified: bool = False
    sessions_checked: int = 0
    #: Order-independent sum of the per-session checksums on each side.
    source_checksum: str = ""
    destination_checksum: str = ""
    #: Sessions that differ (missing, other content or other ids) where they must not.
    mismatched_sessions: list[str] = field(default_factory=list)
    #: Merge: sessions the destination already had with other content, kept as they were.
    kept_sessions: list[str] = field(default_factory=list)
    #: Per table (other than sessions/messages/usage): source rows missing or different.
    mismatched_rows: dict[str, int] = field(default_factory=dict)
    kept_rows: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.verified and not self.mismatched_sessions and not self.mismatched_rows

    def as_dict(self, limit: int | None = LISTED) -> dict[str, Any]:
        """Plain data for ``--json`` (long lists cut at ``limit``, their full length kept)."""

        def cut(items: list[Any]) -> list[Any]:
            return [list(i) if isinstance(i, tuple) else i for i in (items if limit is None else items[:limit])]

        doc: dict[str, Any] = {}
        for name, value in self.__dict__.items():
            if isinstance(value, list):
                doc[name] = cut(value)
                if limit is not None and len(value) > limit:
                    doc[f"{name}_count"] = len(value)
            else:
                doc[name] = value
        doc["ok"] = self.ok
        return doc


# ---------------------------------------------------------------------------- endpoints


@dataclass(frozen=True)
class Endpoint:
    """One side of a copy: a SQLite file or a server URL."""

    role: str
    path: Path | None = None
    url: URL | None = None

    @property
    def label(self) -> str:
        """How the side is shown and recorded (a server URL without its password)."""
        if self.path is not None:
            return str(self.path)
        assert self.url is not None
        return self.url.render_as_string(hide_password=True)


def endpoint(value: Any, role: str) -> Endpoint:
    """Parse ``value`` (a path, a ``sqlite:///`` or ``postgresql://`` URL) into an Endpoint.

    Typed errors, nothing touched: an empty value, a NUL or undecodable bytes in a path,
    a URL that does not parse, an in-memory database, an unsupported kind of database.
    ``postgresql://`` means the psycopg driver, the one hermes_store ships with.
    """
    if isinstance(value, Endpoint):
        return value
    if isinstance(value, URL):
        url = value
    else:
        try:
            raw = os.fspath(value)
        except TypeError:
            raise errors.InvalidInputError(
                f"the {role} must be a path or a database URL, not {type(value).__name__}") from None
        text_value = os.fsdecode(raw) if isinstance(raw, bytes) else raw
        if not text_value.strip():
            raise errors.InvalidInputError(f"the {role} is empty; give a file path or a database URL")
        if "\x00" in text_value:
            raise errors.InvalidInputError(f"the {role} holds a NUL character")
        if "://" not in text_value:
            try:
                text_value.encode("utf-8")
            except UnicodeEncodeError:
                raise errors.InvalidInputError(
                    f"the {role} path {text_value!r} is not UTF-8; SQLite cannot open it (rename it or link to it)"
                ) from None
            return Endpoint(role, path=Path(text_value).expanduser())
        scheme = text_value.split("://", 1)[0]
        try:
            url = make_url(text_value)
        except Exception:  # sqlalchemy.exc.ArgumentError, ValueError from a bad port...
            # The text itself is not repeated: it may hold a password.
            raise errors.InvalidInputError(f"the {role} is not a valid {scheme}:// database URL") from None
    backend = url.get_backend_name()
    if backend == "postgresql":
        if not url.database:
            raise errors.InvalidInputError(f"the {role} URL names no database (postgresql+psycopg://user@host/DBNAME)")
        if url.drivername == "postgresql":
            url = url.set(drivername="postgresql+psycopg")
        return Endpoint(role, url=url)
    if backend == "sqlite":
        database = url.database
        if not database or database == ":memory:" or database.startswith("file:"):
            raise errors.InvalidInputError(f"the {role} URL must name a database file (sqlite:///path/to/state.db)")
        return Endpoint(role, path=Path(database).expanduser())
    raise errors.UnsupportedDatabaseError(
        f"the {role} is a {backend} database; copy supports SQLite files and postgresql+psycopg:// servers"
    )


def _server_key(url: URL) -> tuple[str, int, str, str]:
    """Where a server URL points: host, port, database and tenant schema (``?schema=``)."""
    host = (url.host or "localhost").lower()
    if host in ("127.0.0.1", "::1", "[::1]"):
        host = "localhost"
    schema = url.query.get("schema")
    return host, int(url.port or 5432), str(url.database), str(schema or "")


def _refuse_same(src: Endpoint, dst: Endpoint) -> None:
    """Copying a store onto itself would read what it writes: refused before anything else."""
    same = False
    if src.path is not None and dst.path is not None:
        a, b = os.path.realpath(src.path), os.path.realpath(dst.path)
        same = a == b
        if not same and os.path.exists(a) and os.path.exists(b):
            with suppress(OSError):
                same = os.path.samefile(a, b)
    elif src.url is not None and dst.url is not None:
        same = _server_key(src.url) == _server_key(dst.url)
    if same:
        raise errors.InvalidInputError(f"the source and the destination are the same database ({dst.label})")


# ---------------------------------------------------------------------------- reading files read-only


@contextmanager
def _readonly_engine(path: Path) -> Iterator[Engine]:
    """An engine on one read-only connection to ``path`` (sidecars we create are removed)."""
    with paths.readonly_connection(path) as raw:
        engine = create_engine("sqlite://", creator=lambda: raw, poolclass=StaticPool)
        try:
            yield engine
        finally:
            engine.dispose()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process: alive
    return True


def _remove_stale_work_dirs(folder: Path) -> None:
    """Work folders of copies that were killed (their process is gone) are ours to remove."""
    with suppress(OSError):
        for entry in os.scandir(folder):
            if not entry.name.startswith(WORK_PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            pid = entry.name[len(WORK_PREFIX):].split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
                shutil.rmtree(entry.path, ignore_errors=True)


@contextmanager
def _work_copy(real: Path, folder: Path, progress: Progress) -> Iterator[Path]:
    """A private snapshot of ``real`` (SQLite's backup API, WAL content included), removed afterwards."""
    folder = folder.expanduser()
    if not folder.is_dir():
        raise errors.DatabaseUnavailableError(f"the work folder {folder} does not exist")
    _remove_stale_work_dirs(folder)
    size = real.stat().st_size
    with suppress(OSError):
        size += os.stat(f"{real}-wal").st_size
    with suppress(OSError):
        free = shutil.disk_usage(folder).free
        if free < size * WORK_SPACE_FACTOR:
            raise errors.DiskFullError(
                f"reading {real} needs an adopted copy of it, about {size * WORK_SPACE_FACTOR:,} bytes free in "
                f"{folder}, which has {free:,}; free some space or pass another work folder. Nothing was written"
            )
    try:
        work = Path(tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}-", dir=folder))
    except PermissionError as exc:
        raise errors.ReadOnlyDatabaseError(f"cannot create a work folder in {folder}: {exc}") from exc
    except OSError as exc:
        raise errors.DatabaseUnavailableError(f"cannot create a work folder in {folder}: {exc}") from exc
    try:
        tmp = work / "state.db"
        paths.create_private_database(tmp)
        with paths.readonly_connection(real) as src, closing(sqlite3.connect(tmp)) as dst:

            def step(_status: int, remaining: int, total: int) -> None:
                progress("snapshot", total - remaining, total)

            try:
                src.backup(dst, pages=4096, progress=step)
            except sqlite3.DatabaseError as exc:
                raise paths.sqlite_refusal(real, exc) from exc
        yield tmp
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def _source_engine(src: Endpoint, work_dir: Path, progress: Progress, report: CopyReport) -> Iterator[Engine]:
    """An engine that reads the source at our newest revision, never writing it."""
    if src.url is not None:
        engine = create_engine(src.url, isolation_level="SERIALIZABLE")
        try:
            revision = migrations.current(engine)
            if revision is None:
                raise errors.NotMigratedError(f"{src.label} holds no hermes_store database; there is nothing to copy")
            if revision not in paths.our_revision_ids():
                raise errors.SchemaTooNewError(
                    f"{src.label} is at revision {revision!r}, which this hermes_store does not know; upgrade hermes_store"
                )
            report.source_revision = revision
            yield engine
        finally:
            engine.dispose()
        return
    assert src.path is not None
    real = paths.check_target(src.path, write=False)
    found = adopt.detect(real, deep=False)  # typed refusals: not a database, not Hermes', too new
    newest = paths.head()
    if found.already_adopted and found.revision == newest:
        report.source_revision = newest
        with _readonly_engine(real) as engine:
            yield engine
        return
    if found.already_adopted and found.revision is None:
        raise errors.NotAHermesDatabaseError(f"{real} has an empty {paths.VERSION_TABLE} table; left unchanged")
    if found.already_adopted and found.revision not in paths.our_revision_ids() | set(migrations.LEGACY_IDS):
        raise errors.SchemaTooNewError(
            f"{real} is at revision {found.revision!r}, which this hermes_store does not know; upgrade hermes_store"
        )
    if found.problems:
        raise errors.AdoptionError(
            f"{real} (Hermes schema_version {found.schema_version}) has a shape adoption cannot repair, so it "
            "cannot be read; left unchanged:\n  - " + "\n  - ".join(found.problems)
        )
    report.source_revision = found.revision
    report.source_work_copy = True
    with _work_copy(real, work_dir, progress) as tmp:
        if found.already_adopted:
            migrations.upgrade(tmp)
        else:
            adopt.adopt(tmp, backup=False,
                        progress=lambda stage, fraction: progress(f"adopt:{stage}", round(fraction * 100), 100))
        with _readonly_engine(tmp) as engine:
            yield engine


# ---------------------------------------------------------------------------- the destination before writing


@dataclass
class _DestState:
    revision: str | None = None
    #: Rows per copied table (state_meta: keys that travel).
    data: dict[str, int] = field(default_factory=dict)
    marker: dict[str, Any] | None = None

    @property
    def rows(self) -> int:
        return sum(self.data.values())


def _read_marker(value: Any) -> dict[str, Any] | None:
    try:
        marker = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return None
    return marker if isinstance(marker, dict) and marker.get("format") == MARKER_FORMAT else None


def _dest_state(conn: Connection, label: str) -> _DestState:
    names = set(inspect(conn).get_table_names())
    ours = paths.VERSION_TABLE in names or paths.host_revision(conn) is not None
    if not ours:
        if "schema_version" in names:
            raise errors.AdoptionError(
                f"{label} is a Hermes state.db that is not adopted yet; adopt it first "
                "(hermes-store --db PATH adopt) or copy to a new file. Nothing was written"
            )
        if names & {"sessions", "messages"}:
            raise errors.NotAHermesDatabaseError(
                f"{label} has a sessions/messages table that hermes_store did not make; refusing to write into it"
            )
        return _DestState()
    state = _DestState(revision=migrations.current(conn))
    if state.revision is not None and state.revision not in paths.our_revision_ids() | set(migrations.LEGACY_IDS):
        raise errors.SchemaTooNewError(
            f"{label} is at revision {state.revision!r}, which this hermes_store does not know; upgrade hermes_store"
        )
    for name in COPIED_TABLES:
        if name not in names:
            continue
        if name == "state_meta":
            meta = _TABLES["state_meta"]
            rows = conn.execute(select(meta.c.key, meta.c.value)).all()
            state.data[name] = sum(1 for key, _v in rows if meta_key_copied(key))
            state.marker = next((_read_marker(v) for k, v in rows if k == MARKER_KEY), None)
        else:
            state.data[name] = int(conn.execute(select(func.count()).select_from(_TABLES[name])).scalar() or 0)
    return state


def _inspect_destination(dst: Endpoint) -> _DestState:
    """What the destination holds, read without writing or creating anything."""
    if dst.path is not None:
        real = paths.check_target(dst.path, write=True, create=True)
        if not real.exists() or real.stat().st_size == 0:
            return _DestState()
        paths.check_file(real, recovery_ok=True)
        if adopt.needs_adoption(real):
            raise errors.AdoptionError(
                f"{real} is a Hermes state.db that is not adopted yet; adopt it first "
                f"(hermes-store --db {real} adopt) or copy to a new file. Nothing was written"
            )
        with _readonly_engine(real) as engine, engine.connect() as conn:
            try:
                return _dest_state(conn, str(real))
            except sqlite3.DatabaseError as exc:
                raise paths.sqlite_refusal(real, exc) from exc
    engine = create_engine(dst.url)  # type: ignore[arg-type]
    try:
        with paths.connect(engine) as conn:
            try:
                return _dest_state(conn, dst.label)
            finally:
                conn.rollback()
    finally:
        engine.dispose()


def _decide(state: _DestState, source: str, merge: bool, report: CopyReport) -> dict[str, Any]:
    """The marker this run works under; refuses a destination holding other data."""
    marker = state.marker
    if marker is not None and marker.get("source") == source:
        if marker.get("merge") and not merge:
            raise DestinationNotEmptyError(
                f"{report.destination} holds an unfinished or finished copy of {source} that was started with "
                "--merge (the destination held other data before it); pass --merge again to carry on. Nothing was written"
            )
        report.already_complete = marker.get("state") == "done"
        report.resumed = not report.already_complete
        return dict(marker)  # its own merge flag: a copy into an empty store stays exact
    if state.rows and not merge:
        held = ", ".join(f"{n:,} {t}" for t, n in state.data.items() if n)
        raise DestinationNotEmptyError(
            f"{report.destination} already holds data ({held}); pass --merge to add this history to it "
            "(sessions already there are kept as they are, as import does). Nothing was written"
        )
    return {"format": MARKER_FORMAT, "source": source, "merge": bool(state.rows) and merge, "state": "running",
            "started_at": time.time(), "pending_links": {}}


def _writer_engine(dst: Endpoint) -> Engine:
    """The destination's engine, set up as SessionDB sets up its own (WAL on a file)."""
    target: Any = dst.path if dst.path is not None else dst.url
    engine = create_engine(target, busy_timeout_ms=60_000)
    dialect = for_connection(engine)
    event.listen(engine, "connect", lambda dbapi_conn, _rec: dialect.on_connect(dbapi_conn, label="copy destination"))
    return engine


# ---------------------------------------------------------------------------- checksums


def _canonical(values: Iterable[Any]) -> bytes:
    """Values by type and exact content, unambiguously: ``repr`` of the tuple (a float's
    repr round-trips its bits, text is quoted and escaped, ``1``, ``1.0`` and ``'1'``
    differ), with driver buffer types read as the bytes they hold."""
    return repr(tuple(bytes(v) if isinstance(v, (bytearray, memoryview)) else v for v in values)).encode(
        "utf-8", "surrogatepass")


def _feed(h: Any, values: Iterable[Any]) -> None:
    data = _canonical(values)
    h.update(len(data).to_bytes(8, "big") + data)


def _row_digest(values: Iterable[Any]) -> bytes:
    return hashlib.sha256(_canonical(values)).digest()


_MOD = 2**256


@dataclass
class _SessionSum:
    content: str
    ids: str
    title: Any

    def whole(self) -> int:
        return int.from_bytes(_row_digest([self.content, self.ids, self.title]), "big")


# ---------------------------------------------------------------------------- the copy


class _Copier:
    """One run: source snapshot → destination, then index upkeep and verification."""

    def __init__(self, src: Connection, dst: Connection, report: CopyReport, marker: dict[str, Any], *,
                 batch: int, progress: Progress) -> None:
        self.src, self.dst = src, dst
        self.report, self.marker = report, marker
        self.batch, self.progress = batch, progress
        self.merge = bool(marker.get("merge"))
        self.src_dialect, self.dst_dialect = for_connection(src), for_connection(dst)
        #: child → parent links waiting for their parent; parent → children, for lookup.
        self.links: dict[str, str] = dict(marker.get("pending_links") or {})
        self.waiting: dict[str, list[str]] = defaultdict(list)
        for child, parent in self.links.items():
            self.waiting[parent].append(child)
        self.pending = 0  # rows written in the open destination transaction
        self.wrote = False  # anything written since the marker was last stored
        self.cols: dict[str, list[str] | None] = {}
        self.identity_behind = False
        self.buffer = _Buffer()
        self.mcols: list[str] = []

    # ------------------------------------------------------------------ plumbing

    def columns(self, name: str) -> list[str] | None:
        """Columns of ``name`` both sides have and the model knows (None: not in the source)."""
        if name not in self.cols:
            model = _TABLES[name]
            have = [r[0] for r in self.src_dialect.table_info(self.src, name)]
            if not have:
                self.cols[name] = None
                return None
            dest = {r[0] for r in self.dst_dialect.table_info(self.dst, name)}
            unknown = sorted(c for c in have if c not in model.c)
            if unknown:
                self.report.skipped_columns[name] = unknown
            self.cols[name] = [c for c in model.c.keys() if c in have and c in dest]
        return self.cols[name]

    def _store_marker(self) -> None:
        self.marker["pending_links"] = dict(self.links)
        self.marker["updated_at"] = time.time()
        meta = self.dst_dialect.upsert_sql("state_meta", ["key", "value"], ["key"], "value = excluded.value")
        self.dst.execute(text(meta), {"key": MARKER_KEY, "value": json.dumps(self.marker, sort_keys=True)})

    def _present(self, conn: Connection, column: Any, values: Iterable[Any]) -> set[Any]:
        """Which of ``values`` ``column`` holds (IN lists of at most ID_CHUNK)."""
        wanted = [v for v in dict.fromkeys(values) if v is not None]
        found: set[Any] = set()
        for start in range(0, len(wanted), ID_CHUNK):
            chunk = wanted[start:start + ID_CHUNK]
            found.update(r[0] for r in conn.execute(select(column).where(column.in_(chunk))))
        return found

    def _pages(self, name: str, cols: Sequence[str], size: int) -> Iterator[list[tuple[Any, ...]]]:
        """Source rows of ``name`` in keyset pages of its primary key (rows with a NULL key left out)."""
        table = _TABLES[name]
        key = [c.name for c in table.primary_key.columns]
        at = [list(cols).index(k) for k in key]
        base = select(*(table.c[c] for c in cols)).where(*(table.c[k].is_not(None) for k in key))
        base = base.order_by(*(table.c[k] for k in key)).limit(size)
        last: tuple[Any, ...] | None = None
        while True:
            query = base
            if last is not None:
                if len(key) == 1:
                    query = query.where(table.c[key[0]] > last[0])
                else:
                    query = query.where(tuple_(*(table.c[k] for k in key))
                                        > tuple_(*(literal(v, table.c[k].type) for k, v in zip(key, last))))
            rows = [tuple(r) for r in self.src.execute(query)]
            if not rows:
                return
            yield rows
            if len(rows) < size:
                return
            last = tuple(rows[-1][i] for i in at)

    def _count(self, conn: Connection, name: str, where: Any = None) -> int:
        query = select(func.count()).select_from(_TABLES[name])
        if where is not None:
            query = query.where(where)
        return int(conn.execute(query).scalar() or 0)

    def _null_keys(self, name: str) -> Any:
        table = _TABLES[name]
        keys = [c for c in table.primary_key.columns]
        cond = keys[0].is_(None)
        for k in keys[1:]:
            cond = cond | k.is_(None)
        return cond

    # ------------------------------------------------------------------ run

    def run(self) -> None:
        report = self.report
        clock = time.monotonic()
        for name in self._source_tables():
            if name in COPIED_TABLES or name in _SILENT:
                continue
            rows = int(self.src.execute(select(func.count()).select_from(_TABLES.get(name, sa_table(name)))).scalar() or 0)
            if rows:
                why = NOT_COPIED.get(name, "not a hermes_store table")
                report.skipped_tables[name] = f"{rows:,} row(s): {why}"
        self._count_not_copyable()
        for name in BEFORE_SESSIONS:
            self.copy_table(name)
        self.copy_sessions()
        for name in AFTER_SESSIONS:
            self.copy_table(name)
        if self.wrote or not (report.already_complete or report.resumed):
            self._store_marker()
        self.dst.commit()
        report.seconds["copy"] = round(time.monotonic() - clock, 3)
        clock = time.monotonic()
        self.index()
        report.seconds["index"] = round(time.monotonic() - clock, 3)
        clock = time.monotonic()
        self.dst.execution_options(**self.dst_dialect.begin_options(False))  # verifying only reads
        self.verify()
        self.dst.execution_options(**self.dst_dialect.begin_options(True))
        report.seconds["verify"] = round(time.monotonic() - clock, 3)
        if report.ok and (self.marker.get("state") != "done" or report.sessions_copied or report.messages_copied):
            self.marker["state"] = "done"
            self.marker["finished_at"] = time.time()
            self._store_marker()
        elif not report.ok:
            self.marker["state"] = "unverified"
            self._store_marker()
        self.dst.commit()

    def _source_tables(self) -> list[str]:
        """The source's plain tables (its full-text index tables and SQLite's own left out)."""
        names = set(inspect(self.src).get_table_names())
        indexes = set(self.src_dialect.fts_indexes(self.src))
        shadows = {f"{index}{suffix}" for index in indexes for suffix in FTS_SHADOWS}
        return sorted(n for n in names - indexes - shadows if not n.startswith("sqlite_"))

    def _count_not_copyable(self) -> None:
        """Rows no destination can hold: a NULL key, a message or ledger row of a missing session."""
        report = self.report
        for name in COPIED_TABLES:
            if self.columns(name) is None:
                continue
            n = self._count(self.src, name, self._null_keys(name))
            if name in ("messages", "session_model_usage"):
                table = _TABLES[name]
                n += self._count(self.src, name, ~exists().where(S.c.id == table.c.session_id))
            if n:
                report.not_copyable[name] = n

    # ------------------------------------------------------------------ tables on their own keys

    def copy_table(self, name: str) -> None:
        """Rows the destination lacks (by key) are inserted; what it has is left alone."""
        cols = self.columns(name)
        if cols is None:
            return
        table = _TABLES[name]
        key = [c.name for c in table.primary_key.columns]
        sql = text(self.dst_dialect.upsert_sql(name, cols, key, _UPSERT_UPDATES.get(name)))
        newer = _NEWER.get(name)
        total = self._count(self.src, name)
        done = 0
        for page in self._pages(name, cols, self.batch):
            rows = [dict(zip(cols, r)) for r in page]
            done += len(rows)
            if name == "state_meta":
                self.report.skipped_meta_keys += [r["key"] for r in rows if not meta_key_copied(r["key"])]
                rows = [r for r in rows if meta_key_copied(r["key"])]
            there = self._lookup(self.dst, name, cols, [tuple(r[k] for k in key) for r in rows])
            rows = [r for r in rows if (found := there.get(tuple(r[k] for k in key))) is None
                    or (newer is not None and newer(r, found))]
            if rows:
                self.dst.execute(sql, rows)
                self.wrote = True
            self.commit(name, done, total)

    def _lookup(self, conn: Connection, name: str, cols: Sequence[str],
                keys: Sequence[tuple[Any, ...]]) -> dict[tuple[Any, ...], dict[str, Any]]:
        """The rows ``conn`` holds for these primary keys, by key."""
        table = _TABLES[name]
        key = [c.name for c in table.primary_key.columns]
        column = table.c[key[0]] if len(key) == 1 else tuple_(*(table.c[k] for k in key))
        found: dict[tuple[Any, ...], dict[str, Any]] = {}
        for start in range(0, len(keys), ID_CHUNK):
            chunk = keys[start:start + ID_CHUNK]
            values = [k[0] for k in chunk] if len(key) == 1 else list(chunk)
            for r in conn.execute(select(*(table.c[c] for c in cols)).where(column.in_(values))):
                row = dict(zip(cols, r))
                found[tuple(row[k] for k in key)] = row
        return found

    # ------------------------------------------------------------------ sessions with their messages

    def copy_sessions(self) -> None:
        scols = self.columns("sessions")
        if scols is None:
            return
        self.scols = scols
        self.mcols = self.columns("messages") or []
        self.ucols = self.columns("session_model_usage")
        self.id_at = self.mcols.index("id") if "id" in self.mcols else None
        # NULLs a trigger or a column default would fill in on the way in: put back after.
        info = self.dst_dialect.table_info(self.dst, "messages")
        self.restore_nulls = [name for name, not_null, default in info
                              if name in self.mcols and not not_null and default is not None]
        if "display_order" in self.mcols:
            self.restore_nulls.append("display_order")
        total = self._count(self.src, "sessions", S.c.id.is_not(None))
        done = 0
        for page in self._pages("sessions", scols, ID_CHUNK):
            rows = [dict(zip(scols, r)) for r in page]
            present = self._present(self.dst, S.c.id, (r["id"] for r in rows))
            todo = [r for r in rows if r["id"] not in present]
            self.report.sessions_present += len(rows) - len(todo)
            if todo:
                self._copy_page(todo, lambda n: self.commit("sessions", done + n, total))
            done += len(rows)
            self.commit("sessions", done, total)
        if self.links:
            # Parents the source named but this run never brought (it changed under a
            # resumed copy): link to those the destination has, drop the rest.
            there = self._present(self.dst, S.c.id, set(self.links.values()))
            for child, parent in sorted(self.links.items()):
                if parent in there:
                    self.dst.execute(update(S).where(S.c.id == child).values(parent_session_id=parent))
                else:
                    self.report.dropped_links.append((child, parent))
            self.links.clear()
            self.waiting.clear()
            self.wrote = True
        # Later appends continue after the copied ids (every run: a killed one may have
        # committed its ids without getting here).
        self.dst_dialect.sync_identity(self.dst, "messages")
        self.identity_behind = False
        self.commit("sessions", done, total)

    def commit(self, stage: str, done: int, total: int | None) -> None:
        """Write what is buffered, then end the destination transaction (marker included)."""
        self._flush()
        if self.wrote:
            self._store_marker()
        self.dst.commit()
        self.pending = 0
        self.wrote = False
        self.progress(stage, done, total)

    def _copy_page(self, todo: list[dict[str, Any]], checkpoint: Callable[[int], None]) -> None:
        """Copy these sessions (absent from the destination), each whole in one transaction."""
        ids = [r["id"] for r in todo]
        page = _Page(todo)
        parents = {r.get("parent_session_id") for r in todo} - {None}
        page.parents_dst = self._present(self.dst, S.c.id, parents)
        rest = parents - page.parents_dst
        page.parents_src = (rest & set(ids)) | self._present(self.src, S.c.id, rest - set(ids))
        page.prompts_dst = self._present(self.dst, P.c.hash, (r.get("system_prompt_hash") for r in todo))
        page.titles_dst = self._present(self.dst, S.c.title, (r.get("title") for r in todo))
        if self.ucols:
            at = self.ucols.index("session_id")
            query = select(*(U.c[c] for c in self.ucols)).where(U.c.session_id.in_(ids))
            for row in self.src.execute(query):
                page.usage[row[at]].append(dict(zip(self.ucols, row)))
        sid_at = self.mcols.index("session_id")
        query = (select(*(M.c[c] for c in self.mcols)).where(M.c.session_id.in_(ids))
                 .order_by(M.c.session_id, M.c.id))
        stream = self.src.execute(query, execution_options={"stream_results": True, "yield_per": max(self.batch, 100)})
        handled = 0
        current: Any = None
        rows: list[tuple[Any, ...]] = []
        big: _BigSession | None = None
        try:
            for row in stream:
                sid = row[sid_at]
                if sid != current:
                    if current is not None:
                        self._finish(page, current, rows, big)
                        handled += 1
                        self._maybe_commit(checkpoint, handled)
                    if sid in page.done or sid not in page.rows:
                        raise CopyError(f"internal error: messages of session {sid!r} arrived out of order")
                    current, rows, big = sid, [tuple(row)], None
                elif big is not None:
                    big.add(tuple(row))
                else:
                    rows.append(tuple(row))
                    if len(rows) >= self.batch:
                        big = _BigSession(self, page, sid, rows)
                        rows = []
            if current is not None:
                self._finish(page, current, rows, big)
                handled += 1
                self._maybe_commit(checkpoint, handled)
        finally:
            stream.close()
        for sid in ids:
            if sid not in page.done:
                self._finish(page, sid, [], None)
                handled += 1
                self._maybe_commit(checkpoint, handled)

    def _maybe_commit(self, checkpoint: Callable[[int], None], handled: int) -> None:
        if self.pending >= self.batch:
            checkpoint(handled)

    def _finish(self, page: "_Page", sid: Any, rows: list[tuple[Any, ...]], big: "_BigSession | None") -> None:
        """A session read whole: buffered for the transaction (a big one is written already)."""
        if big is not None:
            big.finish()
            return
        self._add_session(page, page.rows[sid])
        self.buffer.messages.append((sid, [dict(zip(self.mcols, r)) for r in rows]))
        self.buffer.usage += page.usage.pop(sid, [])
        self.pending += len(rows) + 1
        page.done.add(sid)

    def _add_session(self, page: "_Page", row: dict[str, Any]) -> None:
        """Buffer a session row, with the links and names the destination can hold."""
        row = dict(row)
        sid = row["id"]
        parent = row.get("parent_session_id")
        if parent is not None and parent not in page.parents_dst and parent not in page.inserted:
            row["parent_session_id"] = None
            if parent in page.parents_src:
                self.links[sid] = parent
                self.waiting[parent].append(sid)
            else:
                self.report.dropped_links.append((sid, parent))
        digest = row.get("system_prompt_hash")
        if digest is not None and digest not in page.prompts_dst:
            row["system_prompt_hash"] = None
            self.report.dropped_prompts.append((sid, digest))
        title = row.get("title")
        if title is not None and title in page.titles_dst:
            row["title"] = self._free_title(title, page)
            self.report.renamed_titles.append((sid, title, row["title"]))
        if row.get("title") is not None:
            page.titles_dst.add(row["title"])
        self.buffer.sessions.append(row)
        page.inserted.add(sid)
        self.report.sessions_copied += 1
        self.wrote = True

    def _free_title(self, title: str, page: "_Page") -> str:
        """The next "title #N" nobody has (a merge met a title already in use)."""
        self._flush()  # titles of buffered sessions must be visible to the lookup
        base, _n = split_title_number(title)
        candidate = SessionRepository(self.dst).next_title_in_lineage(title)
        number = 2
        while candidate == title or candidate in page.titles_dst or self._present(self.dst, S.c.title, [candidate]):
            candidate = f"{base} #{number}"
            number += 1
        return candidate

    def _flush(self) -> None:
        """Write the buffered sessions, then their messages (ids kept when all are free), then ledgers."""
        buf = self.buffer
        if buf.empty:
            return
        self.buffer = _Buffer()
        if buf.sessions:
            self.dst.execute(insert(S), buf.sessions)
            for row in buf.sessions:
                children = self.waiting.pop(row["id"], None)
                if not children:
                    continue
                for start in range(0, len(children), ID_CHUNK):
                    chunk = children[start:start + ID_CHUNK]
                    self.dst.execute(update(S).where(S.c.id.in_(chunk)).values(parent_session_id=row["id"]))
                for child in children:
                    self.links.pop(child, None)
        if buf.messages:
            ids = [m["id"] for _sid, items in buf.messages for m in items]
            taken: set[Any] = set()
            for start in range(0, len(ids), ID_CHUNK):
                chunk = ids[start:start + ID_CHUNK]
                taken.update(r[0] for r in self.dst.execute(select(M.c.id).where(M.c.id.in_(chunk))))
            # A session keeps its ids only when every one is free (import's rule): reads
            # order by id, so keeping some and renumbering others would reorder it.
            moved = [(sid, items) for sid, items in buf.messages if taken and any(m["id"] in taken for m in items)]
            renumbered = {sid for sid, _items in moved}
            self._write_messages([m for sid, items in buf.messages if sid not in renumbered for m in items], keep=True)
            for sid, items in moved:
                self._write_messages(items, keep=False)
                self.report.renumbered_sessions.append(sid)
        if buf.usage:
            self.dst.execute(insert(U), buf.usage)
        self.wrote = True

    def _write_messages(self, items: list[dict[str, Any]], keep: bool) -> None:
        """Insert messages with their ids (``keep``) or with new ones in the same order."""
        if not items:
            return
        if keep:
            MessageRepository(self.dst).insert_rows(items)  # THE bulk insert (staged on SQLite)
            self.identity_behind = True
            self._restore_nulls([(item["id"], item) for item in items])
        else:
            if self.identity_behind:
                self.dst_dialect.sync_identity(self.dst, "messages")  # new ids must follow the kept ones
                self.identity_behind = False
            placed = []
            for item in items:
                values = {k: v for k, v in item.items() if k not in ("id", "display_order")}
                placed.append((self.dst.execute(insert(M).values(**values).returning(M.c.id)).scalar_one(), item))
            self._restore_nulls(placed, renumbered=True)
        self.report.messages_copied += len(items)
        self.wrote = True

    def _restore_nulls(self, placed: list[tuple[Any, dict[str, Any]]], renumbered: bool = False) -> None:
        for name in self.restore_nulls:
            if renumbered and name == "display_order":
                continue  # derived from the new ids, as import does
            ids = [new_id for new_id, item in placed if item.get(name) is None]
            for start in range(0, len(ids), ID_CHUNK):
                chunk = ids[start:start + ID_CHUNK]
                self.dst.execute(update(M).where(M.c.id.in_(chunk)).values({name: None}))

    # ------------------------------------------------------------------ search indexes

    def index(self) -> None:
        """Short-CJK index caught up in bounded transactions; full-text indexes checked."""
        repo = MaintenanceRepository(self.dst)
        total = bigram.pending(self.dst) if bigram.installed(self.dst) else 0
        self.dst.commit()
        done = 0
        while total:
            n = repo.catch_up_search_index(INDEX_CHUNK)
            self.dst.commit()
            done += n
            self.progress("index", min(done, total), total)
            if not n:
                break
        self.report.indexed_rows = done
        found = repo.fts_integrity_check()
        self.dst.rollback()
        if any(problem is not None for problem in found.values()):
            self.report.rebuilt_indexes = repo.rebuild_search()
            self.dst.commit()
            found = repo.fts_integrity_check()
            self.dst.rollback()
        self.report.search_indexes = found

    # ------------------------------------------------------------------ verification

    def verify(self) -> None:
        report = self.report
        src_sum = dst_sum = 0
        for name in COPIED_TABLES:
            if self.columns(name) is None:
                continue
            if name == "state_meta":
                keys = _TABLES[name].c.key
                s = sum(1 for (k,) in self.src.execute(select(keys)) if meta_key_copied(k))
                d = sum(1 for (k,) in self.dst.execute(select(keys)) if meta_key_copied(k))
            else:
                s, d = self._count(self.src, name), self._count(self.dst, name)
            report.tables[name] = {"source": s, "destination": d}
        scols = self.columns("sessions")
        if scols is not None:
            total = self._count(self.src, "sessions", S.c.id.is_not(None))
            checked = 0
            for page in self._pages("sessions", scols, ID_CHUNK):
                s_rows = {r[scols.index("id")]: dict(zip(scols, r)) for r in page}
                ids = list(s_rows)
                d_rows = {}
                for start in range(0, len(ids), ID_CHUNK):
                    chunk = ids[start:start + ID_CHUNK]
                    for r in self.dst.execute(select(*(S.c[c] for c in scols)).where(S.c.id.in_(chunk))):
                        d_rows[r[scols.index("id")]] = dict(zip(scols, r))
                self._expected(s_rows)
                s_sums = self._digests(self.src, s_rows)
                d_sums = self._digests(self.dst, d_rows)
                for sid in ids:
                    a, b = s_sums[sid], d_sums.get(sid)
                    src_sum = (src_sum + a.whole()) % _MOD
                    if b is None:
                        report.mismatched_sessions.append(sid)
                        continue
                    dst_sum = (dst_sum + b.whole()) % _MOD
                    verdict = self._compare(a, b)
                    if verdict == "kept":
                        report.kept_sessions.append(sid)
                    elif verdict != "same":
                        report.mismatched_sessions.append(sid)
                checked += len(ids)
                self.progress("verify", checked, total)
            report.sessions_checked = checked
            if not self.merge:
                self._counts_match("sessions", report.not_copyable.get("sessions", 0))
                self._counts_match("messages", report.not_copyable.get("messages", 0))
                self._counts_match("session_model_usage", report.not_copyable.get("session_model_usage", 0))
        for name in (*BEFORE_SESSIONS, *AFTER_SESSIONS):
            self._verify_table(name)
        self.dst.rollback()
        report.source_checksum = f"{src_sum:064x}"
        report.destination_checksum = f"{dst_sum:064x}"
        report.verified = True

    def _counts_match(self, name: str, not_copyable: int) -> None:
        counts = self.report.tables.get(name)
        if counts and counts["destination"] != counts["source"] - not_copyable:
            self.report.mismatched_rows[name] = abs(counts["source"] - not_copyable - counts["destination"])

    def _expected(self, rows: dict[Any, dict[str, Any]]) -> None:
        """The source rows as the destination must hold them: links that cannot be stored dropped."""
        parents = {r.get("parent_session_id") for r in rows.values()} - {None}
        known = self._present(self.src, S.c.id, parents) | self._present(self.dst, S.c.id, parents)
        prompts = {r.get("system_prompt_hash") for r in rows.values()} - {None}
        stored = self._present(self.src, P.c.hash, prompts) | self._present(self.dst, P.c.hash, prompts)
        for r in rows.values():
            if r.get("parent_session_id") is not None and r["parent_session_id"] not in known:
                r["parent_session_id"] = None
            if r.get("system_prompt_hash") is not None and r["system_prompt_hash"] not in stored:
                r["system_prompt_hash"] = None

    def _digests(self, conn: Connection, rows: dict[Any, dict[str, Any]]) -> dict[Any, _SessionSum]:
        """Per session: content (row but title, usage ledger, messages but ids) and ids."""
        content = {sid: hashlib.sha256() for sid in rows}
        ids = {sid: hashlib.sha256() for sid in rows}
        for sid, row in rows.items():
            _feed(content[sid], (v for k, v in row.items() if k != "title"))
        keys = list(rows)
        mcols = self.columns("messages") or []
        if mcols:
            sid_at, plain = mcols.index("session_id"), [i for i, c in enumerate(mcols) if c not in ("id", "display_order")]
            idents = [mcols.index(c) for c in ("id", "display_order") if c in mcols]
            for start in range(0, len(keys), ID_CHUNK):
                chunk = keys[start:start + ID_CHUNK]
                query = (select(*(M.c[c] for c in mcols)).where(M.c.session_id.in_(chunk))
                         .order_by(M.c.session_id, M.c.id))
                result = conn.execute(query, execution_options={"stream_results": True, "yield_per": 2000})
                try:
                    for r in result:
                        sid = r[sid_at]
                        _feed(content[sid], (r[i] for i in plain))
                        _feed(ids[sid], (r[i] for i in idents))
                finally:
                    result.close()
        if self.ucols:
            ledger: dict[Any, list[bytes]] = defaultdict(list)
            for start in range(0, len(keys), ID_CHUNK):
                chunk = keys[start:start + ID_CHUNK]
                for r in conn.execute(select(*(U.c[c] for c in self.ucols)).where(U.c.session_id.in_(chunk))):
                    ledger[r[self.ucols.index("session_id")]].append(_row_digest(r))
            for sid, digests in ledger.items():
                for d in sorted(digests):
                    content[sid].update(d)
        return {sid: _SessionSum(content[sid].hexdigest(), ids[sid].hexdigest(), rows[sid].get("title")) for sid in rows}

    def _compare(self, a: _SessionSum, b: _SessionSum) -> str:
        same_title = a.title == b.title or (
            self.merge and a.title is not None and b.title is not None
            and split_title_number(b.title)[0] == split_title_number(a.title)[0]
        )
        if a.content == b.content and same_title and (a.ids == b.ids or self.merge):
            return "same"
        return "kept" if self.merge else "differs"

    def _verify_table(self, name: str) -> None:
        """Every source row is in the destination, equal (outside a merge: and nothing more)."""
        cols = self.columns(name)
        if cols is None:
            return
        key = [c.name for c in _TABLES[name].primary_key.columns]
        missing = differing = 0
        for page in self._pages(name, cols, ID_CHUNK):
            rows = [dict(zip(cols, r)) for r in page]
            if name == "state_meta":
                rows = [r for r in rows if meta_key_copied(r["key"])]
            found = self._lookup(self.dst, name, cols, [tuple(r[k] for k in key) for r in rows])
            for row in rows:
                there = found.get(tuple(row[k] for k in key))
                if there is None:
                    missing += 1
                elif _row_digest(there.values()) != _row_digest(row.values()):
                    differing += 1
        counts = self.report.tables.get(name, {})
        expected = counts.get("source", 0) - self.report.not_copyable.get(name, 0)
        extra = 0 if self.merge else max(0, counts.get("destination", 0) - expected)
        if self.merge and differing:
            self.report.kept_rows[name] = differing
            differing = 0
        if missing or differing or extra:
            self.report.mismatched_rows[name] = missing + differing + extra


class _Page:
    """A page of source sessions being copied, with what was looked up for it."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = {r["id"]: r for r in rows}
        self.parents_dst: set[Any] = set()
        self.parents_src: set[Any] = set()
        self.prompts_dst: set[Any] = set()
        self.titles_dst: set[Any] = set()
        self.usage: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        #: Sessions buffered or written so far (a parent among them can be linked to).
        self.inserted: set[Any] = set()
        self.done: set[Any] = set()


class _Buffer:
    """What the open transaction will write: session rows, then messages, then ledgers."""

    def __init__(self) -> None:
        self.sessions: list[dict[str, Any]] = []
        self.messages: list[tuple[Any, list[dict[str, Any]]]] = []
        self.usage: list[dict[str, Any]] = []

    @property
    def empty(self) -> bool:
        return not (self.sessions or self.messages or self.usage)


class _BigSession:
    """A session with more than ``batch`` messages: one transaction of its own, streamed in.

    Whether it keeps its ids is decided before any is written, from all of them.
    """

    def __init__(self, copier: _Copier, page: _Page, sid: Any, first: list[tuple[Any, ...]]) -> None:
        self.copier, self.page, self.sid = copier, page, sid
        copier._flush()  # the sessions before it go first (their ids count as taken)
        self.keep = not self._any_taken()
        copier._add_session(page, page.rows[sid])
        copier._flush()
        self.count = 0
        self.rows: list[tuple[Any, ...]] = []
        for r in first:
            self.add(r)

    def _any_taken(self) -> bool:
        c = self.copier
        query = select(M.c.id).where(M.c.session_id == self.sid).order_by(M.c.id)
        result = c.src.execute(query, execution_options={"stream_results": True, "yield_per": ID_CHUNK})
        try:
            for chunk in result.partitions(ID_CHUNK):
                ids = [r[0] for r in chunk]
                if c.dst.execute(select(M.c.id).where(M.c.id.in_(ids)).limit(1)).first() is not None:
                    return True
        finally:
            result.close()
        return False

    def add(self, row: tuple[Any, ...]) -> None:
        self.rows.append(row)
        if len(self.rows) >= self.copier.batch:
            self._write()

    def _write(self) -> None:
        if self.rows:
            self.copier._write_messages([dict(zip(self.copier.mcols, r)) for r in self.rows], self.keep)
            self.count += len(self.rows)
            self.copier.pending += len(self.rows)
            self.rows = []

    def finish(self) -> None:
        self._write()
        c = self.copier
        c.buffer.usage += self.page.usage.pop(self.sid, [])
        self.page.done.add(self.sid)
        if not self.keep and self.count:
            c.report.renumbered_sessions.append(self.sid)


# ---------------------------------------------------------------------------- entry point


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

    Returns the :class:`CopyReport`. Raises typed errors before writing anything for bad
    arguments, an unreadable source and a destination that holds other data without
    ``merge`` (:class:`DestinationNotEmptyError`); raises :class:`CopyVerificationError`
    (its ``report`` attached) when the finished copy does not match the source.
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise errors.InvalidInputError(f"batch must be a whole number from 1 to {MAX_BATCH:,}, not {batch!r}")
    progress = progress or _quiet
    source, target = endpoint(src, "source"), endpoint(dst, "destination")
    _refuse_same(source, target)
    source_label = str(Path(os.path.realpath(source.path))) if source.path is not None else source.label
    report = CopyReport(source=source_label, destination=target.label, merge=merge)
    started = time.monotonic()
    state = _inspect_destination(target)
    marker = _decide(state, source_label, merge, report)
    report.merge = bool(marker.get("merge"))
    if work_dir is not None:
        folder = Path(work_dir)
    elif target.path is not None:
        folder = Path(os.path.realpath(target.path)).parent
    else:
        folder = Path(tempfile.gettempdir())
    with ExitStack() as stack:
        clock = time.monotonic()
        src_engine = stack.enter_context(_source_engine(source, folder, progress, report))
        src_conn = stack.enter_context(paths.connect(src_engine))
        src_conn.execution_options(postgresql_readonly=True, postgresql_deferrable=True)
        src_conn.begin()  # one snapshot for the whole run
        report.seconds["open_source"] = round(time.monotonic() - clock, 3)
        clock = time.monotonic()
        migrations.upgrade(target.path if target.path is not None else target.url)  # type: ignore[arg-type]
        dst_engine = _writer_engine(target)
        stack.callback(dst_engine.dispose)
        dst_conn = stack.enter_context(paths.connect(dst_engine))
        dst_conn.execution_options(**for_connection(dst_conn).begin_options(True))
        report.seconds["open_destination"] = round(time.monotonic() - clock, 3)
        _Copier(src_conn, dst_conn, report, marker, batch=batch, progress=progress).run()
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
