"""Session activity stamps, lineage-wide flags (pinned, hidden, read), model config and git metadata (Hermes v24-v26)."""

from __future__ import annotations

from ._host import Host

#: Module-level Hermes names defined here; the facade (hermes_state) re-exports them.
__all__: list[str] = []


class ActivityMixin(Host):
    pass
