"""hermes_store: the session-state layer of an AI agent, on SQLAlchemy 2.0 + Alembic.

Nothing is created or connected at import time.
"""

import importlib
from typing import TYPE_CHECKING, Any

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
if TYPE_CHECKING:  # what __getattr__ below serves, for type checkers
    from .facade import SessionDB, apply_wal_with_fallback, format_session_db_unavailable, get_last_init_error
    from .uow import UnitOfWork

__version__ = "0.1.0"

#: Names served from the module that holds them, imported on first use (PEP 562): the
#: facade pulls in SQLAlchemy and Alembic, which ``hermes-store --version`` and
#: ``--help`` never need. ``from hermes_store import SessionDB`` works as always.
_LAZY = {
    "SessionDB": "facade",
    "apply_wal_with_fallback": "facade",
    "format_session_db_unavailable": "facade",
    "get_last_init_error": "facade",
    "UnitOfWork": "uow",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})

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
