"""The two sides of a copy: a SQLite file (plain, or encrypted with its key) or a
server URL, parsed with typed errors before anything is touched, and refused when both
name the same database.

Each file side carries its own key: the key given for that side, or the
``sqlite://:<key>@/<path>`` URL's password part, else the environment's
(``$HERMES_STORE_KEY``, ``$HERMES_STORE_KEY_FILE``), as for every store opened by
path; a side with none is a plain file. So a copy between a plain and an encrypted
file names the encrypted side's key and runs without a key in the environment (which
would be the plain side's too, and refused there). A keyed file is only ever opened
through :func:`hermes_store.encryption.connect`; the environment never gives a server
side a key."""

from __future__ import annotations

import os
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Iterator

from sqlalchemy import Engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import StaticPool

from .. import encryption, errors, paths
from ..dialects import backend_name, find_for, with_driver
from ..engine import create_engine
from ..paths import SIDECARS


@dataclass(frozen=True)
class Endpoint:
    """One side of a copy: a SQLite file or a server URL."""

    role: str
    path: Path | None = None
    url: URL | None = None
    #: An encrypted file's key (None: a plain file, or a server). Never shown.
    key: encryption.StoreKey | None = None

    def __repr__(self) -> str:
        return f"Endpoint({self.role!r}, {self.label!r}, encrypted={self.key is not None})"

    @property
    def keyed_url(self) -> URL:
        """A file side as a SQLite URL carrying its key (what the keyed engine opens)."""
        assert self.path is not None
        return encryption.url_with_key(URL.create("sqlite", database=str(self.path)), self.key)

    @property
    def label(self) -> str:
        """How the side is shown and recorded (a server URL without its password)."""
        if self.path is not None:
            return str(self.path)
        assert self.url is not None
        return self.url.render_as_string(hide_password=True)


def endpoints(src: Any, dst: Any, source_key: encryption.KeyLike | None = None,
              destination_key: encryption.KeyLike | None = None) -> tuple[Endpoint, Endpoint]:
    """Both sides of a copy, each file side with its key (see the module docstring)."""
    return endpoint(src, "source", source_key), endpoint(dst, "destination", destination_key)


def check_keys(*sides: Endpoint) -> None:
    """Before anything of the copy is written (the destination's folder, its lock file):
    each existing file side opens with its key, read-only (a wrong key is
    EncryptionKeyError), and one given no key that looks encrypted is EncryptionKeyError
    naming the key to supply."""
    for side in sides:
        if side.path is None:
            continue
        try:
            real = paths.resolve_link(side.path)
            if not real.is_file() or real.stat().st_size == 0:
                continue
        except (OSError, errors.HermesStoreError):
            continue  # the side's own checks say what is wrong with it
        if side.key is not None:
            with keyed_readonly_connection(real, side.key):
                continue
        if encryption.looks_encrypted(real):
            raise encryption.refused_without_key(
                real, errors.NotADatabaseError(f"the {side.role} {real} has no SQLite header"))


def endpoint(value: Any, role: str, key: encryption.KeyLike | None = None) -> Endpoint:
    """Parse ``value`` (a path, a ``sqlite:///`` or ``postgresql://`` URL) into an Endpoint.

    Typed errors, nothing touched: an empty value, a NUL or undecodable bytes in a path,
    a URL that does not parse, an in-memory database, an unsupported kind of database,
    a key for a server, or a key given both as ``key`` and in a ``sqlite://`` URL,
    differently. ``postgresql://`` means the psycopg driver, the one hermes_store
    ships with. A file's key: ``key``, the URL's password part, else the
    environment's (:func:`hermes_store.encryption.resolve`); none: a plain file.
    """
    if isinstance(value, Endpoint):
        return value
    given = encryption.as_key(key)
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
            return Endpoint(role, path=Path(text_value).expanduser(), key=encryption.resolve(given))
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
        if given is not None:
            raise errors.InvalidInputError(
                f"a key for the {role} opens an encrypted SQLite file; a server database's encryption at rest "
                "is the server's (its disk or provider)")
        if "+" not in url.drivername:  # no driver named: the dialect's sync one (psycopg 3)
            url = with_driver(url, asyncio=False)
        return Endpoint(role, url=url)
    if kind is not None:
        database = url.database
        if not database or database == ":memory:" or database.startswith("file:"):
            raise errors.InvalidInputError(f"the {role} URL must name a database file (sqlite:///path/to/state.db)")
        # The URL's password part is the file's key; a different key= is refused.
        return Endpoint(role, path=Path(database).expanduser(), key=encryption.resolve(given, url))
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
def sidecars_as_found(p: Path, key: encryption.StoreKey) -> Iterator[None]:
    """Around a keyed read-only connection to ``p``: the ``-wal``/``-shm`` a reader of a
    WAL-mode file creates are removed again when it created them, as
    :func:`hermes_store.paths.readonly_connection` does for a plain file (one short
    keyed read-write open lets SQLite remove an empty WAL, the file's bytes untouched;
    where the kernel refuses that open, the two empty files are unlinked)."""
    wal, shm = Path(f"{p}-wal"), Path(f"{p}-shm")
    had_wal, had_shm = wal.exists(), shm.exists()
    try:
        yield
    finally:
        if not had_wal and wal.exists() and not had_shm:
            with suppress(OSError, errors.HermesStoreError, *encryption.driver_errors()):
                if wal.stat().st_size == 0:
                    if os.access(p, os.W_OK):
                        encryption.connect(str(p), key, isolation_level=None).close()
                    else:
                        shm.unlink()
                        wal.unlink()


@contextmanager
def keyed_readonly_connection(p: Path, key: encryption.StoreKey) -> Iterator[Any]:
    """A read-only SQLCipher connection to the encrypted file ``p``, the key checked
    first (a wrong one: EncryptionKeyError, nothing written), sidecars left as found."""
    with sidecars_as_found(p, key):
        conn = encryption.connect(p.absolute().as_uri() + "?mode=ro", key, uri=True, isolation_level=None)
        try:
            yield conn
        finally:
            conn.close()


@contextmanager
def readonly_engine(path: Path, key: encryption.StoreKey | None = None) -> Iterator[Engine]:
    """An engine on one read-only connection to ``path`` (sidecars we create are removed);
    with ``key``, an encrypted file's, through SQLCipher."""
    if key is None:
        with paths.readonly_connection(path) as raw:
            engine = create_engine("sqlite://", creator=lambda: raw, poolclass=StaticPool)
            try:
                yield engine
            finally:
                engine.dispose()
        return
    with keyed_readonly_connection(path, key) as keyed:
        engine = create_engine("sqlite://", creator=lambda: keyed, poolclass=StaticPool,
                               module=encryption.dbapi_module())
        try:
            yield engine
        finally:
            engine.dispose()

