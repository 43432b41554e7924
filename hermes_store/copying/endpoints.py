"""The two sides of a copy: a SQLite file or a server URL, parsed with typed errors
before anything is touched, and refused when both name the same database."""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Iterator

from sqlalchemy import Engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import StaticPool

from .. import errors, paths
from ..dialects import backend_name, find_for, with_driver
from ..engine import create_engine
from ..paths import SIDECARS


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
    kind = find_for(url)
    if kind is not None and not kind.holders_on_this_machine:  # a server, reached by its URL
        if not url.database:
            raise errors.InvalidInputError(f"the {role} URL names no database (postgresql+psycopg://user@host/DBNAME)")
        if "+" not in url.drivername:  # no driver named: the dialect's sync one (psycopg 3)
            url = with_driver(url, asyncio=False)
        return Endpoint(role, url=url)
    if kind is not None:
        database = url.database
        if not database or database == ":memory:" or database.startswith("file:"):
            raise errors.InvalidInputError(f"the {role} URL must name a database file (sqlite:///path/to/state.db)")
        return Endpoint(role, path=Path(database).expanduser())
    raise errors.UnsupportedDatabaseError(
        f"the {role} is a {backend_name(url)} database; copy supports SQLite files and postgresql+psycopg:// servers"
    )


def server_key(url: URL) -> tuple[str, int, str, str]:
    """Where a server URL points: host, port, database and tenant schema (``?schema=``)."""
    host = (url.host or "localhost").lower()
    if host in ("127.0.0.1", "::1", "[::1]"):
        host = "localhost"
    schema = url.query.get("schema")
    return host, int(url.port or 5432), str(url.database), str(schema or "")


def _identity(path: str) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of a file, links followed; None when there is none. Only
    ``stat``: opening and closing a descriptor of a database would drop every SQLite
    lock this process holds on it."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def store_file_named(candidate: str | os.PathLike[str], store: str | os.PathLike[str]) -> str | None:
    """Which file of the SQLite database ``store`` the path ``candidate`` names, or None.

    "the database", "the -wal file of the database", "a hard link to the database"…:
    the file or its ``-wal``/``-shm``/``-journal``, by the path with links resolved
    (the sidecars sit next to the real file, as SQLite puts them, and next to the name
    given) or by the same inode (a hard link). Writing over any of them destroys the
    store, and reading one with a plain ``open()`` drops this process's SQLite locks:
    every command that writes an output or reads an input asks this first.
    """
    cand = os.path.realpath(os.path.expanduser(os.fspath(candidate)))
    cand_id = _identity(cand)
    base = os.path.expanduser(os.fspath(store))
    for suffix in ("", *SIDECARS):
        names = {os.path.realpath(base) + suffix, os.path.realpath(base + suffix)}
        what = "the database" if not suffix else f"the {suffix} file of the database"
        if cand in names:
            return what
        if cand_id is not None and any(_identity(name) == cand_id for name in names):
            return f"a hard link to {what}"
    return None


def refuse_same(src: Endpoint, dst: Endpoint) -> None:
    """Copying a store onto itself, or onto one of its -wal/-shm/-journal files, would
    read what it writes: refused before anything else."""
    if src.path is not None and dst.path is not None:
        what = store_file_named(dst.path, src.path)
        if what is not None and what != "the database":
            raise errors.InvalidInputError(f"the destination {dst.label} is {what} {src.label}, the source")
        what = what or store_file_named(src.path, dst.path)
        if what is not None and what != "the database":
            raise errors.InvalidInputError(f"the source {src.label} is {what} {dst.label}, the destination")
        same = what is not None
    else:
        same = src.url is not None and dst.url is not None and server_key(src.url) == server_key(dst.url)
    if same:
        raise errors.InvalidInputError(f"the source and the destination are the same database ({dst.label})")


@contextmanager
def readonly_engine(path: Path) -> Iterator[Engine]:
    """An engine on one read-only connection to ``path`` (sidecars we create are removed)."""
    with paths.readonly_connection(path) as raw:
        engine = create_engine("sqlite://", creator=lambda: raw, poolclass=StaticPool)
        try:
            yield engine
        finally:
            engine.dispose()

