"""``ThreadedSessionDB``: Hermes' gateway wrapper running each SessionDB call in a worker thread.

Hermes names it ``AsyncSessionDB``, and the facade serves it under that name; the class
is named apart from :class:`hermes_store.aio.AsyncSessionDB` (the native async store),
one class per name, so a traceback or a type error says which of the two it is.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any


class ThreadedSessionDB:
    """Every callable of the wrapped store becomes a coroutine (``asyncio.to_thread``).

    Non-callables (``db_path``, ``read_only``...) pass through. The wrapped store
    stays reachable as ``_db``: Hermes' gateway unwraps it in 15 places.

    ``db`` is a :class:`hermes_store.facade.SessionDB` (or anything shaped like one):
    not imported here, since the facade imports this module to serve it.
    """

    def __init__(self, db: Any) -> None:
        self._db = db

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._db, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(attr, *args, **kwargs)

        return call

    def __repr__(self) -> str:
        # Hermes' text: hosts know this object as hermes_state.AsyncSessionDB.
        return f"AsyncSessionDB({self._db!r})"

