"""hermes_store: the session-state layer of an AI agent, on SQLAlchemy 2.0 + Alembic.

Nothing is created or connected at import time.
"""

from .errors import (
    AdoptionError,
    DatabaseLockedError,
    DatabaseUnavailableError,
    DiskFullError,
    HermesStoreError,
    InvalidInputError,
    InvalidTitleError,
    ManagedByHostError,
    MessageNotFoundError,
    NotADatabaseError,
    NotAHermesDatabaseError,
    NotFoundError,
    NotMigratedError,
    ReadOnlyDatabaseError,
    SchemaTooNewError,
    TitleConflictError,
    UnknownFieldError,
    UnknownSessionError,
    UnsupportedDatabaseError,
)
from .facade import SessionDB, apply_wal_with_fallback, format_session_db_unavailable, get_last_init_error
from .uow import UnitOfWork

__version__ = "0.1.0"

__all__ = [
    "AdoptionError",
    "DatabaseLockedError",
    "DatabaseUnavailableError",
    "DiskFullError",
    "HermesStoreError",
    "InvalidInputError",
    "InvalidTitleError",
    "ManagedByHostError",
    "MessageNotFoundError",
    "NotADatabaseError",
    "NotAHermesDatabaseError",
    "NotFoundError",
    "NotMigratedError",
    "ReadOnlyDatabaseError",
    "SchemaTooNewError",
    "SessionDB",
    "TitleConflictError",
    "UnitOfWork",
    "UnknownFieldError",
    "UnknownSessionError",
    "UnsupportedDatabaseError",
    "__version__",
    "apply_wal_with_fallback",
    "format_session_db_unavailable",
    "get_last_init_error",
]
