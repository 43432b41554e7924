"""Gateway repair (Hermes v25-v26): orphaned sessions, never-active keyed sessions, hygiene streaks."""

from __future__ import annotations

from ._host import Host


class OrphansMixin(Host):
    pass
