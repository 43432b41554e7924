"""Repositories: plain classes over the caller's Session/Connection. They never commit."""

from .lineage import LineageRepository
from .maintenance import MaintenanceRepository
from .messages import MessageRepository
from .records import MessageRecord, MessageWindow, SearchHit, SessionRecord, UsageRow
from .search import SearchRepository
from .sessions import SessionRepository

__all__ = [
    "LineageRepository",
    "MaintenanceRepository",
    "MessageRecord",
    "MessageRepository",
    "MessageWindow",
    "SearchHit",
    "SearchRepository",
    "SessionRecord",
    "SessionRepository",
    "UsageRow",
]
