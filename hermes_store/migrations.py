"""Run hermes_store's Alembic migrations from Python.

``target`` may be a URL, a file path, an :class:`~sqlalchemy.Engine` or a
:class:`~sqlalchemy.Connection`. The revision scripts ship inside the package
(``hermes_store/_alembic``), so this works from an installed wheel.

Host applications either call these functions, or add
:func:`versions_location` to their own ``version_locations`` as a separate branch.
"""

from __future__ import annotations

import os
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, inspect
from sqlalchemy.engine import URL

from . import errors
from .engine import create_engine, to_url

#: Name of our Alembic version table; a host's ``alembic_version`` is never touched.
VERSION_TABLE = "hermes_store_version"

Target = str | os.PathLike[str] | URL | Engine | Connection


def script_location() -> Path:
    """Folder holding env.py and versions/ (installed copy first, source tree second)."""
    import hermes_store

    pkg_dir = Path(hermes_store.__file__).resolve().parent
    for candidate in (pkg_dir / "_alembic", pkg_dir.parent / "alembic"):
        if (candidate / "env.py").is_file():
            return candidate
    raise errors.HermesStoreError("hermes_store migrations are missing from this installation")


def versions_location() -> Path:
    """The ``versions/`` folder, for a host's ``version_locations``."""
    return script_location() / "versions"


def make_config(url: str | None = None, *, version_table: str = VERSION_TABLE) -> Config:
    """An Alembic Config pointing at our scripts, independent of any alembic.ini."""
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location()))
    cfg.set_main_option("version_table", version_table)
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head() -> str:
    """The newest revision id shipped with this copy of hermes_store."""
    return ScriptDirectory.from_config(make_config()).get_current_head()


def _file_path(target: Target) -> Path | None:
    """The SQLite file behind a path/URL target (None for engines, connections, :memory:)."""
    if isinstance(target, (Engine, Connection)):
        return None
    url = to_url(target)
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    if url.database.startswith("file:"):  # a SQLite URI filename; leave it to the driver
        return None
    return Path(url.database)


@contextmanager
def _connection(target: Target) -> Iterator[Connection]:
    if isinstance(target, Connection):
        yield target
        return
    if isinstance(target, Engine):
        with target.connect() as conn:
            yield conn
        return
    url = to_url(target)
    _check_path(url)
    # Migrations run with foreign keys off: legacy files may hold dangling references,
    # and table rebuilds must not cascade.
    engine = create_engine(url, foreign_keys=False)
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


def _check_path(url: URL) -> None:
    """Refuse unreachable paths before SQLite creates a stray file."""
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return
    path = Path(url.database)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise errors.DatabaseUnavailableError(f"cannot open {path}: folder {parent} does not exist")
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        raise errors.DatabaseUnavailableError(f"cannot open {path}: not readable and writable")
    if not path.exists() and not os.access(parent, os.W_OK):
        raise errors.DatabaseUnavailableError(f"cannot create {path}: folder {parent} is not writable")


def _run(target: Target, fn, *args, version_table: str = VERSION_TABLE, **kw):  # type: ignore[no-untyped-def]
    cfg = make_config(version_table=version_table)
    with _connection(target) as conn:
        cfg.attributes["connection"] = conn
        result = fn(cfg, *args, **kw)
        if conn.in_transaction():
            conn.commit()
        return result


def current(target: Target, *, version_table: str = VERSION_TABLE) -> str | None:
    """The revision the database is at (None when un-stamped, missing or empty).

    Never creates the file: asking is not a reason to leave an empty database behind.
    """
    path = _file_path(target)
    if path is not None and (not path.exists() or path.stat().st_size == 0):
        return None
    with _connection(target) as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table": version_table})
        rev = ctx.get_current_revision()
        if conn.in_transaction():
            conn.rollback()
        return rev


def upgrade(target: Target, revision: str = "head", *, version_table: str = VERSION_TABLE) -> str | None:
    """Upgrade to ``revision``; each revision is its own atomic transaction.

    A file Hermes made (a ``schema_version`` table but no ``hermes_store_version``) is
    adopted first (:func:`hermes_store.adopt.adopt`: all-or-nothing, the original kept
    as ``<name>.pre-adopt.bak``). Empty, non-SQLite, truncated and foreign files are
    refused with a typed error and left unchanged.
    """
    path = _file_path(target)
    if path is not None and path.exists():
        from . import adopt

        adopt.check_file(path, recovery_ok=True)
        if adopt.needs_adoption(path, version_table):
            try:
                adopt.adopt(path, revision=revision, version_table=version_table)
            except errors.AdoptionError:
                if adopt.needs_adoption(path, version_table):
                    raise
                # Another process adopted the file while we were copying it; carry on
                # with an ordinary upgrade of the adopted file.
            else:
                return current(target, version_table=version_table)
    created = path is not None and not path.exists()
    try:
        _check_known(target, version_table)
        _run(target, command.upgrade, revision, version_table=version_table)
    except BaseException:
        # A failed first upgrade must not leave the empty file SQLite created on open:
        # the next attempt would (rightly) refuse a 0-byte file.
        if created and path is not None and path.exists() and path.stat().st_size == 0:
            for leftover in (path, Path(f"{path}-journal"), Path(f"{path}-wal"), Path(f"{path}-shm")):
                with suppress(OSError):
                    leftover.unlink()
        raise
    return current(target, version_table=version_table)


def downgrade(target: Target, revision: str, *, version_table: str = VERSION_TABLE) -> str | None:
    """Downgrade to ``revision`` (``"base"`` removes everything)."""
    _check_file(target)
    _check_known(target, version_table)
    _run(target, command.downgrade, revision, version_table=version_table)
    return current(target, version_table=version_table)


def stamp(target: Target, revision: str, *, version_table: str = VERSION_TABLE) -> None:
    """Record ``revision`` without running it (adoption uses this)."""
    _check_file(target)
    _run(target, command.stamp, revision, version_table=version_table)


def _check_file(target: Target) -> None:
    """Typed refusals (empty, text, truncated, unreadable) before SQLite writes a byte.

    Only for a file that exists when we are called: opening a new path creates an
    empty file, which is ours and fine.
    """
    path = _file_path(target)
    if path is not None and path.exists():
        from .adopt import check_file

        check_file(path, recovery_ok=True)


def _check_known(target: Target, version_table: str) -> None:
    """A database stamped with a revision we do not ship is refused, untouched."""
    with _connection(target) as conn:
        try:
            tables = set(inspect(conn).get_table_names())
        except Exception as exc:  # sqlite3.DatabaseError: file is not a database
            raise errors.NotADatabaseError(f"not a SQLite database: {exc}") from exc
        if version_table not in tables and "schema_version" in tables:
            if conn.in_transaction():
                conn.rollback()
            # Reached with an Engine/Connection (a path is adopted by upgrade()): we
            # cannot swap a file under someone else's open engine.
            raise errors.AdoptionError(
                "this database was written by Hermes and is not adopted yet; call "
                "hermes_store.adopt.adopt(path) (or migrations.upgrade(path)) on the file first"
            )
        if version_table not in tables and tables & {"sessions", "messages"}:
            if conn.in_transaction():
                conn.rollback()
            raise errors.NotAHermesDatabaseError(
                "the database has a sessions/messages table but neither Hermes' schema_version "
                f"nor {version_table}; refusing to migrate a foreign schema (left unchanged)"
            )
        rev = None
        if version_table in tables:
            ctx = MigrationContext.configure(conn, opts={"version_table": version_table})
            rev = ctx.get_current_revision()
        if conn.in_transaction():
            conn.rollback()
    if rev is None:
        return
    script = ScriptDirectory.from_config(make_config())
    try:
        script.get_revision(rev)
    except Exception as exc:
        raise errors.SchemaTooNewError(
            f"database is at revision {rev!r}, which this hermes_store does not know "
            f"(newest known: {script.get_current_head()}); upgrade hermes_store"
        ) from exc
