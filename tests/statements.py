"""Statements per call, counted by the bench's own meter (``bench/meter.py``).

A test pins how many statements (SQLite) or round trips (PostgreSQL: BEGIN and
COMMIT/ROLLBACK included, nothing for an autocommit read) one call sends, so a
regression in the number of statements shows as a failure, not as a slower bench
figure nobody reads. The rule is the bench's, loaded from the repository, so the
test and the printed ``st`` column can never count differently.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any
from collections.abc import Callable

_METER_PATH = Path(__file__).resolve().parent.parent / "bench" / "meter.py"


def _load_meter() -> Any:
    name = "hermes_store_bench_meter"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _METER_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


meter = _load_meter()


def count(store: Any, fn: Callable[[], Any]) -> tuple[int, Any]:
    """``(statements or round trips, result)`` of one ``fn()`` on ``store`` (a SessionDB).

    The store's kept connections are traced too, as in the bench.
    """
    # Upkeep under way (an open's catch-up, a checkpoint) runs on the store's upkeep
    # thread: let it finish, so only ``fn``'s own statements are counted.
    store.wait_for_upkeep(60)
    m = meter.EngineMeter(store.engine, lambda: meter.held_connections(store))
    m.start()
    try:
        result = fn()
    finally:
        m.stop()
    return m.count, result


def steady(store: Any, fn: Callable[[], Any], warm: int = 2) -> int:
    """Round trips of ``fn()`` once warm (caches filled, connections kept)."""
    for _ in range(warm):
        fn()
    return count(store, fn)[0]
