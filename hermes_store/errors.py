"""Typed errors. Everything we raise on purpose derives from HermesStoreError."""

from __future__ import annotations

import sqlite3


class HermesStoreError(Exception):
    """Base class of every error hermes_store raises on purpose."""


class DatabaseUnavailableError(HermesStoreError):
    """The database file cannot be opened or created (path, permissions, filesystem)."""


class StoreClosedError(DatabaseUnavailableError, RuntimeError):
    """A call on a SessionDB after ``close()``. A ``RuntimeError`` too: Hermes v26 raises
    one there (``session_count_by_source`` on a closed store), and its callers catch it."""


class NotADatabaseError(HermesStoreError):
    """The file is not a SQLite database, or is corrupt."""


class NotAHermesDatabaseError(HermesStoreError):
    """A SQLite file, but not one Hermes or hermes_store wrote."""


class SchemaTooNewError(HermesStoreError):
    """The file was written by a newer schema than this hermes_store knows."""


class AdoptionError(HermesStoreError):
    """Adopting an existing Hermes file failed; the original is left untouched."""


class NotFoundError(HermesStoreError, LookupError):
    """A session or message the caller named does not exist."""


class TitleConflictError(HermesStoreError, ValueError):
    """The title is already in use by another session."""


class InvalidTitleError(HermesStoreError, ValueError):
    """The title is invalid (too long after sanitizing)."""


class DatabaseLockedError(HermesStoreError, sqlite3.OperationalError):
    """The database stayed locked by other writers for the whole retry budget.

    Also a ``sqlite3.OperationalError``, what Hermes' own SessionDB raises then, so
    code written for Hermes catches it unchanged."""


class InvalidInputError(HermesStoreError, ValueError):
    """An argument cannot be stored as given (a lone surrogate in an id, a bulk item
    without a role, bytes where text is expected...). Nothing was written."""


class ReadOnlyDatabaseError(DatabaseUnavailableError, sqlite3.OperationalError):
    """The file or its folder is read-only (or opened ``read_only=True``), so the write cannot happen.

    Raised before anything is touched: the file stays byte-for-byte unchanged. Also a
    ``sqlite3.OperationalError``, as Hermes raises for a write on a read-only open."""


class DiskFullError(DatabaseUnavailableError):
    """The filesystem is full; the failed transaction was rolled back, earlier rows are intact."""


class UnknownFieldError(InvalidInputError, TypeError):
    """A keyword names no column of the table. Also a TypeError, as Python raises for an
    unexpected keyword argument, so existing ``except TypeError`` callers keep working."""


class NotMigratedError(HermesStoreError):
    """The database has none of our tables yet: run ``hermes_store.migrations.upgrade``."""


class UnsupportedDatabaseError(HermesStoreError):
    """The URL names a database kind (dialect) hermes_store does not support."""


class TenantPlacementError(HermesStoreError):
    """A tenant distributed or moved (Citus) did not check out afterwards: rows that
    differ from before, or tables not all on the node it was sent to. Nothing was
    deleted: Citus' own step committed or rolled back whole."""


class ManagedByHostError(HermesStoreError):
    """Our revisions in this database are run by a host application's Alembic (branch
    mode); migrate it there (``alembic upgrade heads``), not from hermes_store."""


class ConnectionLostError(DatabaseUnavailableError):
    """The connection to the database server broke under a statement (the server or a
    pooler in front of it closed it, reset it, or a cancelled operation left the driver's
    connection unusable). The connection is discarded; the transaction it carried did
    not commit, unless the break came during COMMIT itself (then its outcome is unknown).
    The driver's error is chained (``__cause__``)."""


class PreparedStatementsUnsupportedError(UnsupportedDatabaseError):
    """Server-side prepared statements were asked for (``?prepare_threshold=``,
    ``prepared_statements=True``) and a transaction pooler between here and the server
    does not keep them per client: PgBouncer before 1.21, or a later one without
    ``max_prepared_statements``. Drop the setting, or upgrade the pooler and set it."""


class DependentObjectsError(HermesStoreError):
    """Our tables cannot be dropped (a downgrade): objects of the host application
    depend on them (a foreign key to ``sessions``, a view reading ``messages``...).
    ``dependents`` names each one; nothing was changed. Drop them (or run the host's
    own downgrade) first."""

    def __init__(self, message: str, dependents: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.dependents = tuple(dependents)


class UnknownSessionError(NotFoundError, sqlite3.IntegrityError):
    """A message was written for a session that does not exist.

    Hermes raises ``sqlite3.IntegrityError`` here (the foreign key), and its callers
    catch that; this typed error is one too, on SQLite and PostgreSQL alike.
    """


class MessageNotFoundError(NotFoundError, ValueError):
    """The message named is not in that session (Hermes raises ValueError)."""


# Hermes v24-v26 errors. Each keeps the base class Hermes' callers catch
# (RuntimeError, ValueError, sqlite3.OperationalError) and is a HermesStoreError too.

#: Hermes' default cap on messages a resume or an export may load (``MAX_SAFE_*``).
MAX_SAFE_RESUME_MESSAGES = 20000
MAX_SAFE_EXPORT_MESSAGES = 20000


class WalUnsupportedError(HermesStoreError, sqlite3.OperationalError):
    """WAL was required (``require_wal=True``) and the filesystem would not give it."""


class CompressionSessionClosedError(HermesStoreError, RuntimeError):
    """The session was ended by compression; new turns belong to its live continuation."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(
            f"Session '{session_id}' is closed by compression; "
            "adopt its live continuation before appending messages"
        )


class CompressionSessionBusyError(HermesStoreError, RuntimeError):
    """Another holder owns the session's compression lease (permanent: not retried)."""


class SessionCompressionInProgressError(CompressionSessionBusyError):
    """A compression is running on the session right now (transient: writes retry it)."""


class SessionTurnLeaseLostError(HermesStoreError, RuntimeError):
    """The caller's turn lease is gone or held by another holder (never retried).

    The text always says "turn lease lost": Hermes' ``classify_persistence_error`` and
    its callers' tests match it, whatever the raise site wrote after it."""

    def __init__(self, message: object = "turn lease lost", *args: object) -> None:
        text = str(message)
        if "turn lease lost" not in text.lower():
            text = f"turn lease lost: {text}"
        super().__init__(text, *args)


class SessionResumeTooLargeError(HermesStoreError, ValueError):
    """Resuming would load more messages than the configured cap."""

    def __init__(self, message_count: int, limit: int = MAX_SAFE_RESUME_MESSAGES,
                 scope: str = "across its lineage") -> None:
        self.message_count = message_count
        self.limit = limit
        self.scope = scope
        super().__init__(
            f"Session has {message_count} messages {scope}, over the safe resume limit of {limit}"
        )


class SessionExportTooLargeError(HermesStoreError, ValueError):
    """Exporting the session would load more messages than the configured cap."""

    def __init__(self, session_id: str, message_count: int, limit: int = MAX_SAFE_EXPORT_MESSAGES) -> None:
        self.session_id = session_id
        self.message_count = message_count
        self.limit = limit
        super().__init__(
            f"Session '{session_id}' has {message_count} messages, over the safe export limit of {limit}"
        )


class EncryptionKeyError(NotADatabaseError):
    """An encrypted store and its key do not fit: no key for an encrypted file, a wrong
    key, a key for a file that is not encrypted, or a key file others may read. The
    message names what to supply (``key=``, ``HERMES_STORE_KEY``, ``HERMES_STORE_KEY_FILE``)
    and never the key itself; the file was left byte-for-byte unchanged. A
    :class:`NotADatabaseError` too: without its key an encrypted file is not one."""


class ProviderConfigError(HermesStoreError, ValueError):
    """Hermes' ``sessiondb`` settings (config.yaml) name a provider this build does not
    serve, or leave out what it needs (a server's URL). A ValueError too, as Hermes'
    own provider factory raises for an unknown name; nothing was opened."""
