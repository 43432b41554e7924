"""Encrypted SQLite stores (SQLCipher, the ``hermes-store[encryption]`` extra).

One place decides, for every SQLite file we open, whether it is encrypted and with
what key, and opens it: :func:`resolve` finds the key (an argument, the URL's password
part ``sqlite://:<key>@/<path>``, ``$HERMES_STORE_KEY``, or the file named by
``$HERMES_STORE_KEY_FILE``, readable by its owner only), and :func:`connect` opens a
DB-API connection of SQLCipher's module with ``PRAGMA key`` as its very first
statement, then reads the file once so a wrong key is refused before anything else
(journal mode, PRAGMAs, migrations) touches it.

A key is a passphrase (SQLCipher derives the 256-bit key from it, PBKDF2) or a raw
256-bit key written ``x'<64 hex digits>'``. It is held in a :class:`StoreKey`, whose
``repr``/``str`` never show it; no message we raise, no log line, names it.

``sqlcipher3`` is imported only when a key is in play: a plain SQLite program never
loads it (``tests/test_import_weight.py``).
"""

from __future__ import annotations

import importlib
import hashlib
import os
import re
import stat
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL

from . import errors, held_files

__all__ = [
    "KEY_ENV",
    "KEY_FILE_ENV",
    "SQLCIPHER_MODULE",
    "StoreKey",
    "connect",
    "connection_types",
    "dbapi_module",
    "driver_errors",
    "looks_encrypted",
    "redact",
    "refused_without_key",
    "resolve",
    "url_with_key",
    "url_without_key",
    "verify",
]

#: The environment variable holding a store's key (a passphrase or ``x'<64 hex>'``).
KEY_ENV = "HERMES_STORE_KEY"
#: The environment variable naming a file (mode 0600 or narrower) holding the key.
KEY_FILE_ENV = "HERMES_STORE_KEY_FILE"
#: SQLCipher's DB-API module (PyPI ``sqlcipher3-binary``), imported on first use.
SQLCIPHER_MODULE = "sqlcipher3.dbapi2"
#: What to supply, for every refusal.
HOW_TO_SUPPLY = (f"supply its key: key=... (SessionDB(path, key=...), create_engine(..., key=...)), "
                 f"${KEY_ENV}, or ${KEY_FILE_ENV} naming a 0600 file")

_RAW = re.compile(r"x'([0-9a-fA-F]{64})'")
#: SQLite's "file is not a database" (SQLITE_NOTADB): what a wrong key, or no key, looks like.
_NOTADB = 26
#: sqlcipher3's CLI error texts (not the key) and the message of a wrong-key read.
_NOT_A_DATABASE = "file is not a database"


class StoreKey:
    """A store's key: a passphrase or a raw 256-bit key. Never shown (``repr``, ``str``)."""

    __slots__ = ("_raw", "_secret")

    def __init__(self, secret: str | bytes) -> None:
        if isinstance(secret, bytes):
            if len(secret) != 32:
                raise errors.InvalidInputError("a raw key given as bytes must be 32 bytes (256 bits)")
            secret = "x'" + secret.hex() + "'"
        if not isinstance(secret, str):
            raise errors.InvalidInputError(f"a key is a str or 32 bytes, not {type(secret).__name__}")
        secret = secret.strip("\r\n")
        if not secret:
            raise errors.EncryptionKeyError(f"the key is empty; {HOW_TO_SUPPLY}")
        if "\x00" in secret:
            raise errors.InvalidInputError("a key cannot hold a NUL character")
        self._secret = secret
        self._raw = _RAW.fullmatch(secret) is not None

    def __repr__(self) -> str:
        return "StoreKey(<redacted>)"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("a StoreKey is not pickled")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StoreKey) and other._secret == self._secret

    def __hash__(self) -> int:
        return hash((StoreKey, self._secret))

    @property
    def is_raw(self) -> bool:
        """Whether this is a raw 256-bit key (``x'<hex>'``) rather than a passphrase."""
        return self._raw

    def sql_literal(self) -> str:
        """The key as PRAGMA key / ATTACH ... KEY take it: a quoted string; for a raw key
        the quoted ``x'…'`` form SQLCipher reads as the key bytes, no derivation."""
        if self._raw:
            return '"' + self._secret + '"'
        return "'" + self._secret.replace("'", "''") + "'"

    def secret_for_url(self) -> str:
        """The key as the URL's password part (SQLAlchemy masks it when rendering)."""
        return self._secret


KeyLike = StoreKey | str | bytes


def as_key(value: KeyLike | None) -> StoreKey | None:
    """``value`` as a :class:`StoreKey` (None stays None)."""
    if value is None or isinstance(value, StoreKey):
        return value
    return StoreKey(value)


def read_key_file(path: str | os.PathLike[str]) -> StoreKey:
    """The key in ``path``: a file only its owner may read or write (0600, 0400); a file
    others may read, or a path that is not a regular file, is refused."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except OSError as exc:
        raise errors.EncryptionKeyError(f"cannot read the key file {p}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise errors.EncryptionKeyError(f"the key file {p} is not a regular file")
    if st.st_mode & 0o077:
        raise errors.EncryptionKeyError(
            f"the key file {p} has mode {stat.S_IMODE(st.st_mode):04o}; others may read it. "
            f"Refused: make it readable by its owner only (chmod 600 {p})"
        )
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.EncryptionKeyError(f"cannot read the key file {p} ({type(exc).__name__})") from None
    return StoreKey(text.strip())


def resolve(key: KeyLike | None = None, url: URL | None = None,
            environ: Mapping[str, str] | None = None) -> StoreKey | None:
    """The key a SQLite store is opened with, or None for a plain store.

    In order: ``key``; the URL's password part; ``$HERMES_STORE_KEY``;
    ``$HERMES_STORE_KEY_FILE``. A key argument and a different URL key are refused.
    """
    given = as_key(key)
    in_url = StoreKey(url.password) if url is not None and url.password else None
    if given is not None and in_url is not None and given != in_url:
        raise errors.InvalidInputError("a key was given both in the URL and as key=, and they differ; give one")
    if given is not None or in_url is not None:
        return given or in_url
    env = os.environ if environ is None else environ
    if env.get(KEY_ENV):
        return StoreKey(env[KEY_ENV])
    if env.get(KEY_FILE_ENV):
        return read_key_file(env[KEY_FILE_ENV])
    return None


def url_with_key(url: URL, key: StoreKey | None) -> URL:
    """``url`` carrying ``key`` as its password part (None: no key part)."""
    if key is None:
        return url_without_key(url)
    return url.set(password=key.secret_for_url())


def url_without_key(url: URL) -> URL:
    """``url`` with no key part: what a path, a log line or a message shows."""
    return url._replace(password=None) if url.password else url


def redact(text: str, key: StoreKey | None) -> str:
    """``text`` with the key, if it appears, replaced by ``***`` (for driver messages)."""
    if key is None or not text:
        return text
    secret = key.secret_for_url()
    return text.replace(secret, "***") if secret else text


def looks_encrypted(path: str | os.PathLike[str]) -> bool:
    """Whether a file SQLite refused looks like an encrypted store: no SQLite header, a
    whole number of pages. Read without dropping SQLite's locks (:mod:`.held_files`)."""
    plain_header, smallest_page = b"SQLite format 3\x00", 512
    try:
        size = os.stat(path).st_size
        head = held_files.read_prefix(path, len(plain_header))
    except OSError:
        return False
    return size >= smallest_page and size % smallest_page == 0 and head != plain_header


def refused_without_key(path: str | os.PathLike[str], exc: BaseException) -> BaseException:
    """For a file refused as "not a database" with no key given: EncryptionKeyError naming
    the key to supply when it looks encrypted, else ``exc`` as it was."""
    if isinstance(exc, errors.EncryptionKeyError) or not looks_encrypted(path):
        return exc
    error = errors.EncryptionKeyError(
        f"{path} is not a plain SQLite database: it looks encrypted (or damaged). "
        f"If it is an encrypted store, {HOW_TO_SUPPLY}"
    )
    error.__cause__ = exc
    return error


def dbapi_module() -> Any:
    """SQLCipher's DB-API module; a clear error when the extra is not installed."""
    try:
        return importlib.import_module(SQLCIPHER_MODULE)
    except ImportError:
        raise errors.UnsupportedDatabaseError(
            "an encrypted store needs SQLCipher: install hermes_store's encryption extra (pip install '.[encryption]',"
            " which brings the sqlcipher3 module)"
        ) from None


def driver_errors() -> tuple[type[BaseException], ...]:
    """SQLCipher's DB-API error classes when it is loaded (else none): its errors are not
    ``sqlite3.Error`` subclasses, so raw-DB-API code catches these beside sqlite3's."""
    module = sys.modules.get(SQLCIPHER_MODULE)
    return (module.Error,) if module is not None else ()


def connection_types() -> tuple[type[Any], ...]:
    """SQLCipher's DB-API connection class when it is loaded (else none)."""
    module = sys.modules.get(SQLCIPHER_MODULE)
    return (module.Connection,) if module is not None else ()


def _not_a_database(exc: BaseException) -> bool:
    return getattr(exc, "sqlite_errorcode", None) == _NOTADB or _NOT_A_DATABASE in str(exc).lower()


def verify(conn: Any, key: StoreKey | None, where: str) -> None:
    """Read ``conn``'s file once (its schema): a file the key does not open is refused with
    :class:`~hermes_store.errors.EncryptionKeyError`, before anything writes to it."""
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
    except Exception as exc:
        if not _not_a_database(exc):
            raise
        raise _refusal(conn, key, where) from None


def _refusal(conn: Any, key: StoreKey | None, where: str) -> errors.EncryptionKeyError:
    if key is None:
        return errors.EncryptionKeyError(
            f"{where} cannot be read as a plain SQLite database: it is encrypted, or not a database at all. "
            f"If it is an encrypted store, {HOW_TO_SUPPLY}"
        )
    plain = _plain_database(conn, where)
    if plain:
        return errors.EncryptionKeyError(
            f"{where} is a plain (unencrypted) SQLite database and a key was given: open it without one "
            f"(unset ${KEY_ENV} / ${KEY_FILE_ENV}), or encrypt it first with `hermes-store encrypt`"
        )
    return errors.EncryptionKeyError(
        f"{where}: the key does not open this file (a wrong key, or not a database); {HOW_TO_SUPPLY} "
        "(the one it was encrypted with). The file was not changed"
    )


def _plain_database(conn: Any, where: str) -> bool:
    """Whether ``where`` opens without a key, asked of SQLCipher's own library (the same
    SQLite instance as ``conn``: its POSIX locks are not dropped by this probe's close)."""
    if where == ":memory:" or where.startswith("file:") or not os.path.exists(where):
        return False
    module = dbapi_module()
    try:
        # immutable: no lock taken, no -wal/-shm created (the refused file stays as it was).
        probe = module.connect(Path(where).absolute().as_uri() + "?mode=ro&immutable=1", uri=True)
    except module.Error:
        return False
    try:
        probe.execute("SELECT count(*) FROM sqlite_master").fetchall()
        return True
    except module.Error:
        return False
    finally:
        probe.close()


#: SQLCipher 4's key derivation from a passphrase (its defaults, which we never change):
#: PBKDF2-HMAC-SHA512, 256,000 iterations, a 256-bit key (32 bytes), the file's first 16
#: bytes as salt.
SQLCIPHER_KDF = ("sha512", 256_000, 32)
_SALT_BYTES = 16
#: (passphrase, salt) -> the raw key SQLCipher derives from them: the derivation costs
#: about as much as a whole search (on purpose), and every new connection would pay it.
_derived: dict[tuple[str, bytes], str] = {}
_derived_guard = threading.Lock()


def _derived_literal(key: StoreKey, where: str) -> str | None:
    """The raw-key literal SQLCipher derives from a passphrase for the existing file
    ``where`` (cached per passphrase and salt), or None (a raw key, a new file)."""
    if key.is_raw or where == ":memory:" or not where:
        return None
    try:
        if os.stat(where).st_size < _SALT_BYTES:
            return None
        salt = held_files.read_prefix(where, _SALT_BYTES)  # never an open/close of ours
    except OSError:
        return None
    if len(salt) < _SALT_BYTES:
        return None
    cache_key = (key.secret_for_url(), salt)
    with _derived_guard:
        found = _derived.get(cache_key)
    if found is None:
        digest, iterations, key_bytes = SQLCIPHER_KDF
        raw = hashlib.pbkdf2_hmac(digest, key.secret_for_url().encode("utf-8"), salt, iterations, key_bytes)
        found = "\"x'" + raw.hex() + "'\""
        with _derived_guard:
            _derived[cache_key] = found
    return found


def _keyed(module: Any, database: str, literal: str, args: Any, kwargs: Any) -> Any:
    conn = module.connect(database, *args, **kwargs)
    try:
        conn.execute("PRAGMA cipher_log_level = NONE")  # SQLCipher's own stderr lines (a wrong key's)
        conn.execute(f"PRAGMA key = {literal}")
    except BaseException:
        conn.close()
        raise
    return conn


#: Page cache of an encrypted connection (KiB, as ``PRAGMA cache_size`` takes a negative
#: number): a page read from the OS is decrypted and its HMAC checked, so pages kept
#: decrypted save that work on every later read; a plain file leans on the OS cache.
CACHE_KIB = 32_768


def connect(database: str, key: StoreKey, *args: Any, **kwargs: Any) -> Any:
    """A SQLCipher DB-API connection to ``database`` with ``key`` applied first and checked
    (:func:`verify`); the arguments after the key are ``sqlite3.connect``'s.

    A passphrase's derived key is computed once per file salt and process and given to
    SQLCipher as a raw key (:func:`_derived_literal`); should it not open the file, the
    passphrase itself is tried, then the refusal is raised."""
    module = dbapi_module()
    where = _where(database)
    derived = _derived_literal(key, where)
    if derived is not None:
        conn = _keyed(module, database, derived, args, kwargs)
        try:
            verify(conn, key, where)
            conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
            return conn
        except errors.EncryptionKeyError:
            conn.close()  # not this salt's key after all (a file replaced meanwhile): the passphrase
        except BaseException:
            conn.close()
            raise
    conn = _keyed(module, database, key.sql_literal(), args, kwargs)
    try:
        verify(conn, key, where)
        conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
    except BaseException:
        conn.close()
        raise
    return conn


def _where(database: str) -> str:
    """The file a connect argument names (a ``file:`` URI's path, without its query)."""
    if database.startswith("file:"):
        path = database[len("file:"):].split("?", 1)[0]
        return path[2:] if path.startswith("//") else path
    return database
