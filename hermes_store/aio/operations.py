"""The multi-transaction workflows of :mod:`hermes_store.operations`, awaited over an
AsyncEngine: ``await aio.operations.import_records(engine, records)``.

Each runs the one implementation the sync facade and the CLI use, over a
:class:`~hermes_store.operations.UnitOfWorkSteps` on the engine's sync face, driven on
the loop's greenlet; its waits between tries of a locked write and its pauses between
chunks are ``asyncio.sleep``, so the loop serves other tasks throughout.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any
from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import await_only

from .. import errors, operations
from ..operations import UnitOfWorkSteps
from ..targets import refuse_sync
from .engine import run_sync


def _loop_sleep(seconds: float) -> None:
    await_only(asyncio.sleep(seconds))


def steps_for(engine: AsyncEngine, schema: str | None = None) -> UnitOfWorkSteps:
    """A steps runner over ``engine`` whose sleeps yield to the event loop; use it on the
    loop's greenlet (:func:`hermes_store.aio.run_sync`)."""
    refuse_sync(engine, "operations")
    if not isinstance(engine, AsyncEngine):
        raise errors.InvalidInputError(f"aio.operations take an AsyncEngine, not {type(engine).__name__}")
    return UnitOfWorkSteps(engine.sync_engine, schema, sleep=_loop_sleep)


def _awaited(workflow: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(workflow)
    async def run(engine: AsyncEngine, *args: Any, schema: str | None = None, **kwargs: Any) -> Any:
        steps = steps_for(engine, schema)
        return await run_sync(workflow, steps, *args, **kwargs)

    run.__doc__ = f"``await`` :func:`hermes_store.operations.{workflow.__name__}` over an AsyncEngine " \
                  f"(``schema``: a tenant's). {workflow.__doc__ or ''}"
    return run


optimize_fts_storage = _awaited(operations.optimize_fts_storage)
vacuum = _awaited(operations.vacuum)
import_sessions = _awaited(operations.import_sessions)
import_records = _awaited(operations.import_records)
auto_prune_and_vacuum = _awaited(operations.auto_prune_and_vacuum)
catch_up_search_index = _awaited(operations.catch_up_search_index)
index_search = _awaited(operations.index_search)
apply_retention = _awaited(operations.apply_retention)

__all__ = [
    "apply_retention", "auto_prune_and_vacuum", "catch_up_search_index", "import_records", "import_sessions",
    "index_search", "optimize_fts_storage", "steps_for", "vacuum",
]
