"""Session activity stamps, lineage-wide flags (pinned, hidden, read), model config and git metadata (Hermes v24-v26)."""

from __future__ import annotations

from ._host import Host


class ActivityMixin(Host):
    pass
