"""Models: our DeclarativeBase, the plain tables, and light constructs for FTS.

The sessions model is :class:`AgentSession`; the old name ``Session`` still works for
one release (with a DeprecationWarning) but shadowed ``sqlalchemy.orm.Session`` in
every host module that imported both.
"""

import warnings

from .base import Base, NAMING_CONVENTION
from .tables import (
    AgentSession,
    AsyncDelegation,
    CjkBigram,
    CjkBigramDirty,
    CompressionLock,
    ConversationGeneration,
    GatewayHeartbeat,
    GatewayHygieneState,
    GatewayRouting,
    Message,
    RetentionPolicy,
    SchemaVersion,
    SessionModelUsage,
    SessionTurnLease,
    StateMeta,
    SystemPrompt,
)

metadata = Base.metadata

__all__ = [
    "NAMING_CONVENTION",
    "AgentSession",
    "AsyncDelegation",
    "Base",
    "CjkBigram",
    "CjkBigramDirty",
    "CompressionLock",
    "ConversationGeneration",
    "GatewayHeartbeat",
    "GatewayHygieneState",
    "GatewayRouting",
    "Message",
    "RetentionPolicy",
    "SchemaVersion",
    "SessionModelUsage",
    "SessionTurnLease",
    "StateMeta",
    "SystemPrompt",
    "metadata",
]


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    """Deprecated alias ``Session`` → :class:`AgentSession` (removed in the next release)."""
    if name == "Session":
        warnings.warn(
            "hermes_store.models.Session is renamed AgentSession (it shadowed sqlalchemy.orm.Session)",
            DeprecationWarning,
            stacklevel=2,
        )
        return AgentSession
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
