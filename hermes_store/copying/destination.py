"""The destination before anything is written: what it holds, whether this run may
write there (an empty store, this copy's own unfinished run, or ``merge``), and the
engine that writes it."""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Iterator

from sqlalchemy import Connection, Engine, event, func, inspect, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from .. import adopt, encryption, errors, migrations, paths
from ..dialects import for_connection
from ..dialects.pg_tenants import try_transaction_lock
from ..engine import create_engine
from ..keys import VERSION_TABLE
from ..locks import holding, try_flock
from ..tenant_schema import schema_of_connection
from .endpoints import Endpoint, readonly_engine, server_key
from .plan import (COPIED_TABLES, LOCK_SUFFIX, MARKER_FORMAT, MARKER_KEY, TABLES, CopyError, CopyInProgressError,
                   CopyReport, DestinationNotEmptyError, meta_key_copied)


@contextmanager
def destination_lock(dst: Endpoint) -> Iterator[None]:
    """Hold the destination for this run: a second copy into it is refused, not interleaved.

    Two copies writing one store at once would each decide from a state the other is
    changing (both "empty", one marker overwriting the other). A file destination is
    guarded by ``flock`` on ``<file>.copy-lock`` beside it. A server is guarded by a
    transaction-level advisory lock per database and schema, on a connection of its own
    whose transaction stays open for the whole copy: through a transaction pooler that
    open transaction keeps its server connection, so the lock stays with this run and
    never with the pooler's connection afterwards (a session lock would). Either lock
    is dropped when the holder dies (the server rolls back a dead client's transaction),
    so a killed copy never blocks its own resume.
    """
    if dst.path is not None:
        # A new file in a new folder (``--to ~/back/state.db``): the folder is made here,
        # as the other commands that create a store make theirs.
        real = paths.check_target(dst.path, write=True, create=True, make_parents=True)
        paths.make_parents(real)
        lock = real.with_name(real.name + LOCK_SUFFIX)
        fd = try_flock(lock, error=CopyError)
        if fd is None:
            raise CopyInProgressError(_busy(dst))
        with holding(lock, fd):
            yield
        return
    engine = create_engine(dst.url, poolclass=NullPool)  # type: ignore[arg-type]
    try:
        with paths.connect(engine) as conn:
            conn.begin()
            # The lock lives as long as this transaction, which is idle while the copy
            # writes through other connections: a server's idle-in-transaction timeout
            # must not end it (SET LOCAL: for this transaction only).
            conn.exec_driver_sql("SET LOCAL idle_in_transaction_session_timeout = 0")
            # The schema the store lives in, however the URL names it (none: the role's
            # first schema on its search_path, usually public).
            schema = server_key(dst.url)[3] or conn.exec_driver_sql("SELECT current_schema()").scalar() or "public"  # type: ignore[arg-type]
            if not try_transaction_lock(conn, "copy", schema):
                raise CopyInProgressError(_busy(dst))
            try:
                yield
            finally:
                # Ending the transaction releases the lock. A connection the server
                # dropped took the lock with it: nothing to undo, and the copy's own
                # error (if any) is the one to report.
                with suppress(SQLAlchemyError, errors.HermesStoreError):
                    conn.rollback()
    finally:
        engine.dispose()


def _busy(dst: Endpoint) -> str:
    return (f"another hermes-store copy is writing to {dst.label} right now; nothing was written. Run this "
            "again when it has finished (the same copy resumes where it stopped)")


@dataclass
class DestState:
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


def _dest_state(conn: Connection, label: str) -> DestState:
    schema = schema_of_connection(conn)  # a tenant's tables are looked up in its schema, by name
    names = set(inspect(conn).get_table_names(schema=schema))
    ours = VERSION_TABLE in names or paths.host_revision(conn, schema=schema) is not None
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
        return DestState()
    state = DestState(revision=migrations.current(conn))
    if state.revision is not None and state.revision not in paths.our_revision_ids() | set(migrations.LEGACY_IDS):
        raise errors.SchemaTooNewError(
            f"{label} is at revision {state.revision!r}, which this hermes_store does not know; upgrade hermes_store"
        )
    for name in COPIED_TABLES:
        if name not in names:
            continue
        if name == "state_meta":
            meta = TABLES["state_meta"]
            rows = conn.execute(select(meta.c.key, meta.c.value)).all()
            state.data[name] = sum(1 for key, _v in rows if meta_key_copied(key))
            state.marker = next((_read_marker(v) for k, v in rows if k == MARKER_KEY), None)
        else:
            state.data[name] = int(conn.execute(select(func.count()).select_from(TABLES[name])).scalar() or 0)
    return state


def inspect_destination(dst: Endpoint) -> DestState:
    """What the destination holds, read without writing or creating anything."""
    if dst.path is not None:
        real = paths.check_target(dst.path, write=True, create=True, make_parents=True)
        if not real.exists() or real.stat().st_size == 0:
            return DestState()
        if dst.key is not None:
            # Encrypted: read through its key only (a wrong one refused here, nothing
            # written); never a Hermes file, so there is nothing to adopt.
            with readonly_engine(real, dst.key) as engine, engine.connect() as conn:
                return _dest_state(conn, str(real))
        try:
            paths.check_file(real, recovery_ok=True)
        except errors.NotADatabaseError as exc:
            raise encryption.refused_without_key(real, exc) from exc  # an encrypted file: name the key
        if adopt.needs_adoption(real):
            raise errors.AdoptionError(
                f"{real} is a Hermes state.db that is not adopted yet; adopt it first "
                f"(hermes-store --db {real} adopt) or copy to a new file. Nothing was written"
            )
        with readonly_engine(real) as engine, engine.connect() as conn:
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


def decide(state: DestState, source: str, merge: bool, report: CopyReport) -> dict[str, Any]:
    """The marker this run works under; refuses a destination holding other data."""
    marker = state.marker
    if marker is not None and marker.get("source") == source:
        if marker.get("merge") and not merge:
            raise DestinationNotEmptyError(
                f"{report.destination} holds an unfinished or finished copy of {source} that was started with "
                "--merge (the destination held other data before it); pass --merge again to carry on. "
                "Nothing was written"
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


def writer_engine(dst: Endpoint) -> Engine:
    """The destination's engine, set up as SessionDB sets up its own (WAL on a file)."""
    target: Any = dst.url if dst.path is None else (dst.keyed_url if dst.key is not None else dst.path)
    engine = create_engine(target, busy_timeout_ms=60_000)
    dialect = for_connection(engine)
    event.listen(engine, "connect", lambda dbapi_conn, _rec: dialect.on_connect(dbapi_conn, label="copy destination"))
    return engine

