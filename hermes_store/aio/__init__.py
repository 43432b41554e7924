"""hermes_store for asyncio applications (FastAPI, gateways, bots), on SQLAlchemy's AsyncEngine.

    engine = aio.create_async_engine("postgresql+asyncpg://…")   # or sqlite+aiosqlite:///state.db
    await aio.upgrade(engine)
    async with aio.AsyncUnitOfWork(engine) as uow:
        await uow.sessions.create("s1", "cli")
        await uow.messages.append("s1", "user", "hello")

    async with aio.AsyncSessionDB("postgresql+asyncpg://…") as db:   # Hermes' SessionDB API, awaited
        await db.search_messages("hello")

Drivers: aiosqlite, asyncpg and async psycopg (``postgresql+psycopg://``). The same
repositories and facade code run underneath (see :mod:`.repositories`), so results
equal the sync API's.
"""

try:
    import greenlet  # noqa: F401 - SQLAlchemy's asyncio layer runs on it
except ImportError as exc:  # pragma: no cover - exercised by tests/test_aio_errors.py in a subprocess
    raise ImportError("hermes_store.aio needs the async extra: pip install 'hermes-store[async]'") from exc

from .engine import async_url, create_async_engine, run_sync
from . import operations
from .migrations import current, downgrade, stamp, upgrade
from .repositories import (
    AsyncRepository,
    CompressionRepository,
    FtsUpkeepRepository,
    GatewayRepository,
    HousekeepingRepository,
    LineageRepository,
    ListingRepository,
    MaintenanceRepository,
    MessageRepository,
    RetentionRepository,
    SearchRepository,
    SessionRepository,
    StateMetaRepository,
    TelegramTopicRepository,
    UsageRepository,
)
from .sessiondb import AsyncSessionDB
from .uow import AsyncUnitOfWork

__all__ = [
    "AsyncRepository", "AsyncSessionDB", "AsyncUnitOfWork", "CompressionRepository", "FtsUpkeepRepository",
    "GatewayRepository", "HousekeepingRepository", "LineageRepository", "ListingRepository", "MaintenanceRepository",
    "MessageRepository", "RetentionRepository", "SearchRepository", "SessionRepository", "StateMetaRepository",
    "TelegramTopicRepository",
    "UsageRepository", "async_url", "create_async_engine", "current", "downgrade", "operations", "run_sync", "stamp",
    "upgrade",
]
