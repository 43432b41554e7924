"""Repositories: plain classes over the caller's Session/Connection. They never commit.

:data:`UNIT_OF_WORK` is THE registry of what a unit of work offers (attribute name →
repository class) and :data:`REPOSITORIES` every public repository class: ``UnitOfWork``,
``aio.AsyncUnitOfWork`` and the ``aio`` repository classes are built from them, so a new
repository is added here once (and annotated on the units of work, which a test checks).
"""

from collections.abc import Mapping
from types import MappingProxyType

from .base import Repository

from .compression import CompressionRepository
from .fts_upkeep import FtsUpkeepRepository
from .gateway import GatewayRepository
from .housekeeping import HousekeepingRepository
from .lineage import LineageRepository
from .listing import ListingRepository
from .maintenance import MaintenanceRepository
from .messages import MessageRepository
from .records import MessageRecord, MessageWindow, SearchHit, SessionRecord, UsageRow
from .retention import RetentionRepository
from .search import SearchRepository
from .sessions import SessionRepository
from .state_meta import StateMetaRepository
from .telegram import TelegramTopicRepository
from .usage import ApiCallUsage, UsageRepository

class Repositories:
    """THE registry of what a unit of work offers: attribute name → repository class,
    bound in this order. ``UnitOfWork`` inherits these annotations (so a type checker
    knows ``uow.sessions`` is a :class:`SessionRepository`); ``aio.AsyncUnitOfWork``
    and the ``aio`` classes are built from :data:`UNIT_OF_WORK` / :data:`REPOSITORIES`."""

    sessions: SessionRepository
    messages: MessageRepository
    lineage: LineageRepository
    search: SearchRepository
    maintenance: MaintenanceRepository
    listing: ListingRepository
    usage: UsageRepository
    compression: CompressionRepository
    housekeeping: HousekeepingRepository
    gateway: GatewayRepository
    retention: RetentionRepository


#: :class:`Repositories` as a mapping (attribute → class).
UNIT_OF_WORK: Mapping[str, type[Repository]] = MappingProxyType(dict(Repositories.__annotations__))
#: Every public repository class: a unit of work's, then those used on their own.
REPOSITORIES: tuple[type[Repository], ...] = (
    *UNIT_OF_WORK.values(),
    FtsUpkeepRepository,
    StateMetaRepository,
    TelegramTopicRepository,
)

__all__ = [
    "REPOSITORIES",
    "UNIT_OF_WORK",
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
    "Repositories",
    "RetentionRepository",
    "SearchHit",
    "SearchRepository",
    "SessionRecord",
    "SessionRepository",
    "StateMetaRepository",
    "TelegramTopicRepository",
    "UsageRepository",
    "UsageRow",
]
