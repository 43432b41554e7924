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

try:  # the asyncio API, when the async extra (greenlet) is installed: see hermes_store.aio
    from .aio import AsyncSessionDB, AsyncUnitOfWork
except ImportError:  # pragma: no cover - tests/test_aio_errors.py runs without greenlet in a subprocess
    pass

__version__ = "0.1.0"

__all__ = [
    "AdoptionError",
    "AsyncSessionDB",
    "AsyncUnitOfWork",
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
