"""Gateway state: peers and origins of sessions, routing entries, Telegram topic bindings."""

from __future__ import annotations

from ._host import Host


class GatewayMixin(Host):
    pass
