"""Hermes' ``SessionDB`` methods, one module per theme.

``hermes_store.facade.SessionDB`` inherits every mixin here and adds the plumbing
(opening, connections, transactions, retries). A mixin holds argument handling and
one repository call per method; the SQL is in ``hermes_store.repositories``.

| module | theme |
|---|---|
| sessions | create/ensure/get/end/reopen/update session rows |
| titles | titles and their conflict rules |
| usage | token/cost totals and the per-model usage ledger |
| messages | transcript rows: append, read, replace, rewind, archive |
| lineage | compression tips, resume targets, ancestors, descendants |
| compression | compression locks, failure cooldowns, fallback streaks |
| listing | listing, counting and searching |
| gateway | gateway peers, origins, routing entries, Telegram topics |
| housekeeping | export, import, delete, prune, archive |
| fts | search-index upkeep, VACUUM, state_meta |
| activity | activity stamps, pinned/hidden/read flags, model config, git metadata (v24-v26) |
| display | display fields, reactions, resume/export caps (v24-v26) |
| leases | turn leases (v25) |
| orphans | orphaned-gateway repair, never-active sessions, hygiene streaks (v25-v26) |
| private | `_conn`, `_execute_write`: the internals Hermes' own code uses |
| async_wrapper | `ThreadedSessionDB` (not a mixin; the facade serves it as Hermes' `AsyncSessionDB`) |
"""

from .activity import ActivityMixin
from .compression import CompressionMixin
from .display import DisplayMixin
from .fts import FtsMixin
from .gateway import GatewayMixin
from .housekeeping import HousekeepingMixin
from .leases import TurnLeasesMixin
from .lineage import LineageMixin
from .listing import ListingMixin
from .messages import MessagesMixin
from .orphans import OrphansMixin
from .private import PrivateSurfaceMixin
from .sessions import SessionsMixin
from .titles import TitlesMixin
from .usage import UsageMixin


class HermesSurface(
    SessionsMixin,
    ActivityMixin,
    TitlesMixin,
    UsageMixin,
    MessagesMixin,
    DisplayMixin,
    LineageMixin,
    CompressionMixin,
    TurnLeasesMixin,
    ListingMixin,
    GatewayMixin,
    OrphansMixin,
    HousekeepingMixin,
    FtsMixin,
    PrivateSurfaceMixin,
):
    """Every public Hermes method, by theme (see the table above)."""


__all__ = ["HermesSurface"]
