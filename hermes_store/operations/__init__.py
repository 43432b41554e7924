"""Workflows of several transactions, one function each, over any :class:`Steps` runner.

Each function takes the runner first and runs every step (a chunk, a batch, a probe)
as one transaction of its own, so a long workflow never holds the write lock for long
and a failure leaves the steps before it committed. ``SessionDB`` calls them over its
own connections (an adapter over ``_write`` / ``_read``); the CLI through SessionDB;
code with only an Engine over :class:`UnitOfWorkSteps`::

    steps = UnitOfWorkSteps(engine)            # schema="team_a" for a tenant
    import_records(steps, records)             # 200 sessions a transaction
    optimize_fts_storage(steps, vacuum=False)

| module | workflows |
|---|---|
| fts | optimize_fts_storage, vacuum (and their steps: rebuild_step, demote_legacy_fts, teardown_trash) |
| imports | import_sessions, import_records |
| prune | auto_prune_and_vacuum |
| retention | apply_retention, retention_plan |
| search_index | catch_up_search_index (and index_search, its one-write form) |
| steps | the Steps protocol and UnitOfWorkSteps |

Tenant placement on a Citus cluster (list, distribute, move) is
:mod:`hermes_store.tenancy`'s: a SQLite program never loads it.

This layer uses the repositories, the unit of work, the dialects and the engine; it
never imports the facade, the Hermes mixins or the CLI.
"""

from .fts import Pacing, demote_legacy_fts, optimize_fts_storage, rebuild_step, teardown_trash, vacuum
from .imports import ImportLimits, import_errors, import_records, import_sessions, index_after_import
from .prune import auto_prune_and_vacuum
from .retention import RetentionReport, apply_retention, retention_plan
from .search_index import catch_up_search_index, index_search
from .steps import LONG_BUDGET_S, WRITE_BUDGET_S, Steps, UnitOfWorkSteps

__all__ = [
    "LONG_BUDGET_S",
    "WRITE_BUDGET_S",
    "ImportLimits",
    "Pacing",
    "RetentionReport",
    "Steps",
    "UnitOfWorkSteps",
    "apply_retention",
    "auto_prune_and_vacuum",
    "catch_up_search_index",
    "demote_legacy_fts",
    "import_errors",
    "import_records",
    "import_sessions",
    "index_after_import",
    "index_search",
    "optimize_fts_storage",
    "rebuild_step",
    "retention_plan",
    "teardown_trash",
    "vacuum",
]
