"""Run hermes_store's Alembic migrations from Python.

``target`` may be a URL, a file path, an :class:`~sqlalchemy.Engine` or a
:class:`~sqlalchemy.Connection`. The revision scripts ship inside the package
(``hermes_store/_alembic``), so this works from an installed wheel.

Host applications either call these functions, or add
:func:`versions_location` to their own ``version_locations`` as a separate branch.

Imports run one way: this module adopts Hermes files (:mod:`hermes_store.adopt`), and
both build on :mod:`hermes_store.paths` (version table, head lookup, file checks).
"""

from __future__ import annotations

import os
from contextlib import contextmanager, suppress
from pathlib import Path
from collections.abc import Callable, Iterator
from typing import Any

from alembic import command
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.engine import URL

from . import adopt, dialects, errors, paths
from .dialects import pg_tenants
from .models import Base
from .targets import refuse_async, refuse_session
from .engine import tenant_of, to_url, with_schema
from .paths import VERSION_TABLE, head, make_config, script_location

__all__ = [
    "VERSION_TABLE",
    "current",
    "downgrade",
    "head",
    "make_config",
    "script_location",
    "stamp",
    "upgrade",
    "versions_location",
]

Target = str | os.PathLike[str] | URL | Engine | Connection


def versions_location() -> Path:
    """The ``versions/`` folder, for a host's ``version_locations``."""
    return script_location() / "versions"


def _file_path(target: Target) -> Path | None:
    """The SQLite file behind a path/URL target (None for engines, connections, :memory:)."""
    if isinstance(target, (Engine, Connection)):
        return None
    url = to_url(target)
    found = dialects.find_for(url)
    database = found.database_path(url) if found is not None else None
    if database is None or database.startswith("file:"):  # none, or a SQLite URI filename: the driver's
        return None
    return Path(database)


def _supported(target: URL | Engine | Connection) -> None:
    """Refuse a kind of database we have no dialect module for (before any driver import
    for a URL): SQLite (Hermes' history) and PostgreSQL (one baseline)."""
    if dialects.find_for(target) is None:
        raise errors.UnsupportedDatabaseError(
            f"{dialects.backend_name(target)} databases are not supported by hermes_store migrations "
            "(SQLite or PostgreSQL only)"
        )


@contextmanager
def _connection(target: Target) -> Iterator[Connection]:
    if isinstance(target, Connection):
        _supported(target)
        yield target
        return
    if isinstance(target, Engine):
        _supported(target)
        with paths.connect(target) as conn:
            yield conn
        return
    url = to_url(target)
    _supported(url)  # before a driver is even imported
    with paths.migration_connection(url) as conn:
        yield conn


def _run(
    target: Target, fn: Callable[..., Any], *args: Any, version_table: str = VERSION_TABLE,
    schema: str | None = None, create: bool = False,
) -> Any:
    with _connection(target) as conn:
        return paths.run_alembic(conn, fn, *args, version_table=version_table, schema=schema, create_schema=create)


def _tenant(target: Target, schema: str | None) -> tuple[Target, str | None]:
    """``(target, tenant schema)``: the schema given or the one ``target`` is bound to.

    A path or URL target is given the schema (``?schema=``), so the connection we open
    for it works there. Refused before anything connects or is created (InvalidInputError):
    a name that is not a plain identifier, a schema on SQLite, two different schemas.
    """
    refuse_session(target, "migrations")
    refuse_async(target if not isinstance(target, str) or "://" not in target else to_url(target), "migrations")
    tenant = tenant_of(target, schema)
    if tenant is not None and not isinstance(target, (Engine, Connection)):
        target = with_schema(target, tenant)
    return target, tenant


def _prepare_file(target: Target) -> tuple[Path | None, Path | None]:
    """Checks before a write: path kind and permissions, then any interrupted
    adoption finished; a missing file is created 0600. Returns (real path, the file
    if this call created it)."""
    path = _file_path(target)
    if path is None:
        return None, None
    real = paths.check_target(path, write=True, create=True)
    adopt.finish_interrupted(real)
    if real.exists() and real.stat().st_size == 0:
        return real, None  # SQLite's own view: a 0-byte file is a new, empty database
    if real.exists():
        paths.check_file(real, recovery_ok=True)
        paths.recover_journal(real)  # so adoption sees the file as committed, as Hermes' next open would
        return real, None
    created = real if paths.create_private_database(real) else None
    return real, created


def _drop_if_untouched(created: Path | None, before: os.stat_result | None) -> None:
    """A failed first migration must not leave behind the empty file it created: the
    next attempt would find a database that is neither new nor migrated."""
    if created is None or before is None:
        return
    with suppress(OSError):
        now = created.stat()
        if (now.st_ino, now.st_size, now.st_mtime_ns) != (before.st_ino, before.st_size, before.st_mtime_ns):
            return
        for leftover in (created, *(Path(f"{created}{s}") for s in paths.SIDECARS)):
            with suppress(OSError):
                leftover.unlink()


def current(target: Target, *, version_table: str = VERSION_TABLE, schema: str | None = None) -> str | None:
    """The revision the database is at (None when un-stamped, missing or empty).

    Our version table first; failing that, a host application's version table holding
    a revision of our chain (our revisions run as a branch of the host's Alembic).
    Never creates the file: asking is not a reason to leave an empty database behind.
    With ``schema`` (PostgreSQL), the revision of that tenant; a schema that does not
    exist yet is None, and is not created.
    """
    target, schema = _tenant(target, schema)
    path = _file_path(target)
    if path is not None:
        if not path.exists() or path.stat().st_size == 0:
            return None
        paths.check_target(path, write=False)
    with _reading(target) as conn:
        return _revision_of(conn, version_table, schema)[1]


def _revision_of(
    conn: Connection, version_table: str, schema: str | None = None
) -> tuple[str | None, str | None]:
    """``(version table, revision)``: ours, else a host's holding one of our ids.

    A tenant's tables are looked up in its schema by name, never along the search
    path, where a store kept in ``public`` could stand in for a tenant that has none.
    """
    if inspect(conn).has_table(version_table, schema=schema):
        opts = {"version_table": version_table, "version_table_schema": schema}
        ctx = MigrationContext.configure(conn, opts=opts)
        return version_table, ctx.get_current_revision()
    found = paths.host_revision(conn, version_table, schema=schema)
    return found if found else (None, None)


@contextmanager
def _reading(target: Target) -> Iterator[Connection]:
    """A connection for looking only: a read we start is ended, a caller's transaction is left alone."""
    with _connection(target) as conn:
        hosted = conn.in_transaction()
        try:
            yield conn
        finally:
            if not hosted and conn.in_transaction():
                conn.rollback()


def upgrade(
    target: Target, revision: str = "head", *, version_table: str = VERSION_TABLE, schema: str | None = None
) -> str | None:
    """Upgrade to ``revision``; each revision is its own atomic transaction.

    Before anything is written: the path kind and permissions are checked (a dangling
    symlink, a folder, a read-only file or folder get a typed error), an adoption a
    kill interrupted is finished or rolled back, and empty, non-SQLite, truncated and
    foreign files are refused, all left unchanged. A missing file is created 0600.

    A file Hermes made (a ``schema_version`` table but no ``hermes_store_version``) is
    adopted first (:func:`hermes_store.adopt.adopt`: all-or-nothing, the original kept
    as ``<name>.pre-adopt.bak``). When another process adopts it first, this waits for
    it and carries on with an ordinary upgrade of the adopted file.

    ``schema`` (PostgreSQL only) migrates one tenant: its tables, functions, triggers,
    search objects and version table go in that schema, created when missing; other
    schemas are not touched. An Engine or URL bound to a schema (``?schema=``) means
    the same.
    """
    target, schema = _tenant(target, schema)
    at = _already_at(target, revision, version_table, schema)
    if at is not None:
        return at
    if schema is not None:
        return _upgrade_tenant(target, revision, version_table, schema)
    _refuse_going_back(target, revision, version_table)
    path, created = _prepare_file(target)
    if path is not None and created is None and adopt.needs_adoption(path, version_table):
        try:
            report = adopt.adopt(path, revision=revision, version_table=version_table)
        except errors.AdoptionError:
            if adopt.needs_adoption(path, version_table):
                raise
            # Another process adopted the file meanwhile; carry on with an ordinary
            # upgrade of the adopted file.
        else:
            if report.adopted:
                return current(target, version_table=version_table)
    fresh = created.stat() if created is not None else None
    try:
        _restamp_legacy(target, version_table)
        if _check_known(target, version_table, revision):
            return current(target, version_table=version_table)
        _run(target, command.upgrade, revision, version_table=version_table)
    except BaseException:
        _drop_if_untouched(created, fresh)
        raise
    return current(target, version_table=version_table)


def _is_server(target: Target) -> bool:
    found = dialects.find_for(target if isinstance(target, (Engine, Connection)) else to_url(target))
    return found is not None and not found.holders_on_this_machine  # its clients connect from anywhere


def _already_at(target: Target, revision: str, version_table: str, schema: str | None) -> str | None:
    """``revision`` when a server store is at it already; None when there may be work.

    Every open of a store (SessionDB calls :func:`upgrade`) lands here, almost always on
    a store at head: one read of the version table, named with the tenant's schema
    (never found along the search path), and nothing else: no lock, no DDL, no setting.
    Anything else (another revision, a host's version table, no store yet) goes the
    long way, which takes the migration lock and checks again under it. SQLite files
    always go the long way: their path checks and adoption come first.
    """
    order = paths.revision_order()
    wanted = order[-1] if revision in ("head", "heads") else revision
    if wanted not in order or not _is_server(target):
        return None
    with _reading(target) as conn:
        found = pg_tenants.revision_in(conn, schema, version_table)
    return wanted if found == wanted else None


def _upgrade_tenant(target: Target, revision: str, version_table: str, schema: str) -> str | None:
    """:func:`upgrade` of one PostgreSQL tenant: no file, no adoption, no legacy ids."""
    _refuse_going_back(target, revision, version_table, schema)
    if not _check_known(target, version_table, revision, schema):
        _run(target, command.upgrade, revision, version_table=version_table, schema=schema, create=True)
    return current(target, version_table=version_table, schema=schema)


def _refuse_going_back(target: Target, revision: str, version_table: str, schema: str | None = None) -> None:
    """An upgrade to a revision below the current one is a mistake, not a no-op.

    Alembic would silently do nothing; the caller asked for a schema it will not get.
    Ids are compared by place in the chain (``hs0002`` sits after ``0030``), never as text.
    """
    order = paths.revision_order()
    if revision not in order:
        return  # "head", relative steps and unknown ids are handled further on
    cur = current(target, version_table=version_table, schema=schema)
    if cur in LEGACY_IDS:
        return  # an old id of ours, restamped before anything runs (see _restamp_legacy)
    if cur in order and order.index(revision) < order.index(cur):
        raise errors.InvalidInputError(
            f"database is at revision {cur}; upgrade cannot go back to {revision} "
            "(use downgrade); nothing was changed"
        )


def downgrade(
    target: Target, revision: str, *, version_table: str = VERSION_TABLE, schema: str | None = None
) -> str | None:
    """Downgrade to ``revision`` (``"base"`` removes everything).

    With ``schema``, only that tenant's objects; its schema and (empty) version table
    stay, like the version table of a database taken to base. A missing schema is not created.
    """
    target, schema = _tenant(target, schema)
    _prepare_file(target)
    if schema is None:
        _restamp_legacy(target, version_table)
    if _check_known(target, version_table, revision, schema):
        return current(target, version_table=version_table, schema=schema)
    if schema is not None and current(target, version_table=version_table, schema=schema) is None:
        return None  # nothing of this tenant to take down (and no schema to create for it)
    if revision == "base" and _is_server(target):
        _refuse_host_dependents(target, schema, revision)
    try:
        _run(target, command.downgrade, revision, version_table=version_table, schema=schema)
    except Exception as exc:
        if not _dependents_still_exist(exc):
            raise
        _refuse_host_dependents(target, schema, revision, exc)
        raise
    return current(target, version_table=version_table, schema=schema)


def _dependents_still_exist(exc: BaseException) -> bool:
    """A DROP refused because other objects depend on what it drops (SQLSTATE 2BP01),
    typed by our engine hook or raw from a host's own connection."""
    if isinstance(exc, errors.DependentObjectsError):
        return True
    orig = getattr(exc, "orig", None)
    return getattr(orig if orig is not None else exc, "sqlstate", None) == "2BP01"


def _refuse_host_dependents(target: Target, schema: str | None, revision: str,
                            exc: BaseException | None = None) -> None:
    """Refuse a server downgrade, typed and naming them, while objects of the host's
    (a foreign key to ``sessions``, a view on ``messages``) depend on our tables.

    Before anything runs for ``base`` (every table of ours goes); after the server
    refused a DROP otherwise (``exc``: its transaction rolled back). A host's own
    Connection holds that failed transaction, so its names come from the server's
    message then, instead of the catalogs."""
    if exc is not None and isinstance(target, Connection):
        found = _detail_lines(exc)
    else:
        with _reading(target) as conn:
            found = pg_tenants.host_dependents(conn, schema, sorted(Base.metadata.tables))
    if not found and exc is None:
        return
    where = f" in schema {schema}" if schema else ""
    names = "; ".join(found) if found else " ".join(str(exc).split())
    error = errors.DependentObjectsError(
        f"cannot downgrade{where} to {revision}: objects of the host application depend on hermes_store's "
        f"tables: {names}; drop them (or run the host's own downgrade) first; nothing was changed",
        tuple(found),
    )
    if exc is None:
        raise error
    raise error from (exc.__cause__ if isinstance(exc, errors.DependentObjectsError) and exc.__cause__ else exc)


def _detail_lines(exc: BaseException) -> list[str]:
    """The dependents a 2BP01's DETAIL names (one per line, as the server writes them)."""
    text_ = str(getattr(exc, "orig", None) or exc)
    detail = text_.split("DETAIL:", 1)[1] if "DETAIL:" in text_ else ""
    detail = detail.split("HINT:", 1)[0].split("[SQL:", 1)[0]
    return [line.strip() for line in detail.splitlines() if line.strip()]


def stamp(target: Target, revision: str, *, version_table: str = VERSION_TABLE, schema: str | None = None) -> None:
    """Record ``revision`` without running it (in tenant ``schema``'s version table, creating the schema)."""
    target, schema = _tenant(target, schema)
    _prepare_file(target)
    _run(target, command.stamp, revision, version_table=version_table, schema=schema, create=schema is not None)


#: Our CJK bigram revision was once called "0024", the id Hermes schema v24 needs.
LEGACY_IDS = {"0024": "hs0001"}


def _restamp_legacy(target: Target, version_table: str) -> str | None:
    """Give a file stamped with an old id of ours its new id, before anything runs.

    A file hermes_store wrote while our bigram revision was "0024" is at Hermes v23
    plus that index: ``schema_version`` 23 and no v24 column (``last_activity_at``).
    A real v24 file has both, and keeps its stamp. Returns the new id when it restamped.
    """
    with _connection(target) as conn:
        hosted = conn.in_transaction()
        insp = inspect(conn)
        if not insp.has_table(version_table) or not insp.has_table("sessions"):
            return None
        (rev,) = conn.exec_driver_sql(f'SELECT version_num FROM "{version_table}"').first() or (None,)
        if rev not in LEGACY_IDS:
            return None
        hermes = conn.exec_driver_sql("SELECT max(version) FROM schema_version").scalar()
        columns = {c["name"] for c in insp.get_columns("sessions")}
        new = LEGACY_IDS[rev] if hermes == 23 and "last_activity_at" not in columns else None
        if new is not None:
            if hosted:
                paths.join_driver_transaction(conn)
            conn.execute(  # bound by SQLAlchemy: the driver's paramstyle differs per dialect
                text(f'UPDATE "{version_table}" SET version_num = :new WHERE version_num = :old'),
                {"new": new, "old": rev},
            )
        if not hosted:
            conn.commit()
        return new


def _check_known(target: Target, version_table: str, revision: str | None = None, schema: str | None = None) -> bool:
    """Refuse, untouched, what our revisions must not run on; True when there is nothing to do.

    * a Hermes file not adopted yet (reached with an Engine/Connection; a path is
      adopted by :func:`upgrade`: we cannot swap a file under someone else's engine);
    * a foreign sessions/messages schema;
    * a revision we do not ship (a newer hermes_store wrote it);
    * our revisions recorded in a host application's version table (branch mode): the
      host's Alembic owns them. At the requested revision that is fine (nothing to do);
      otherwise the host must run its ``alembic upgrade heads``.
    """
    with _reading(target) as conn:
        try:
            tables = set(inspect(conn).get_table_names(schema=schema))
        except Exception as exc:  # sqlite3.DatabaseError: file is not a database
            raise errors.NotADatabaseError(f"not a SQLite database: {exc}") from exc
        table, rev = _revision_of(conn, version_table, schema)
    if table is not None and table != version_table:
        wanted = head() if revision in (None, "head", "heads") else revision
        if rev == wanted:
            return True
        raise errors.ManagedByHostError(
            f"hermes_store's revisions in this database are run by a host application's Alembic "
            f"(its table {table} holds {rev}); run `alembic upgrade heads` in that project "
            "instead of migrating it from here"
        )
    if table is None and "schema_version" in tables:
        raise errors.AdoptionError(
            "this database was written by Hermes and is not adopted yet; call "
            "hermes_store.adopt.adopt(path) (or migrations.upgrade(path)) on the file first"
        )
    if table is None and tables & {"sessions", "messages"}:
        raise errors.NotAHermesDatabaseError(
            "the database has a sessions/messages table but neither Hermes' schema_version "
            f"nor {version_table}; refusing to migrate a foreign schema (left unchanged)"
        )
    if rev is not None and rev not in paths.our_revision_ids():
        raise errors.SchemaTooNewError(
            f"database is at revision {rev!r}, which this hermes_store does not know "
            f"(newest known: {head()}); upgrade hermes_store"
        )
    # Already there (every open of a store at head): the read above is enough, and no
    # Alembic command runs, so opening takes no process-wide Alembic turn.
    wanted = head() if revision in (None, "head", "heads") else revision
    return table == version_table and rev is not None and rev == wanted
