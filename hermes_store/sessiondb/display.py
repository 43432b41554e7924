"""Display fields, reactions, resume/export caps and small transcript readers (Hermes v24-v26)."""

from __future__ import annotations

from ._host import Host

#: Module-level Hermes names defined here; the facade (hermes_state) re-exports them.
__all__: list[str] = []


class DisplayMixin(Host):
    pass
