"""Compression guards: the cross-process compression lock, failure cooldowns and streaks."""

from __future__ import annotations

from ._host import Host


class CompressionMixin(Host):
    pass
