"""Turn leases (Hermes v25): one live turn per lineage root, holder-checked."""

from __future__ import annotations

from ._host import Host


class TurnLeasesMixin(Host):
    pass
