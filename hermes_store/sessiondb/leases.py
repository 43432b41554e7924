"""Turn leases (Hermes v25): one live turn per lineage root, holder-checked."""

from __future__ import annotations

from ._host import Host

#: Module-level Hermes names defined here; the facade (hermes_state) re-exports them.
__all__: list[str] = []


class TurnLeasesMixin(Host):
    pass
