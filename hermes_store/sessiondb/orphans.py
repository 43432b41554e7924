"""Gateway repair (Hermes v25-v26): orphaned sessions, never-active keyed sessions, hygiene streaks."""

from __future__ import annotations

from ._host import Host

#: Module-level Hermes names defined here; the facade (hermes_state) re-exports them.
__all__: list[str] = []


class OrphansMixin(Host):
    pass
