"""Display fields, reactions, resume/export caps and small transcript readers (Hermes v24-v26)."""

from __future__ import annotations

from ._host import Host


class DisplayMixin(Host):
    pass
