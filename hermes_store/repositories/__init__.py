"""Repositories: plain classes over the caller's Session/Connection. They never commit."""

from .compression import CompressionRepository
from .fts_upkeep import FtsUpkeepRepository
from .gateway import GatewayRepository
from .housekeeping import HousekeepingRepository
from .lineage import LineageRepository
from .listing import ListingRepository
from .maintenance import MaintenanceRepository
from .messages import MessageRepository
from .records import MessageRecord, MessageWindow, SearchHit, SessionRecord, UsageRow
from .search import SearchRepository
from .sessions import SessionRepository
from .state_meta import StateMetaRepository
from .telegram import TelegramTopicRepository
from .usage import ApiCallUsage, UsageRepository

__all__ = [
    "ApiCallUsage",
    "CompressionRepository",
    "FtsUpkeepRepository",
    "GatewayRepository",
    "HousekeepingRepository",
    "LineageRepository",
    "ListingRepository",
    "MaintenanceRepository",
    "MessageRecord",
    "MessageRepository",
    "MessageWindow",
    "SearchHit",
    "SearchRepository",
    "SessionRecord",
    "SessionRepository",
    "StateMetaRepository",
    "TelegramTopicRepository",
    "UsageRepository",
    "UsageRow",
]
