"""Hermes' ``hermes_state_portability``: ``SessionPortabilityMixin`` (export/import).

Export and import live in :class:`hermes_store.sessiondb.housekeeping.HousekeepingMixin`;
SessionDB inherits this class too, so ``isinstance`` checks and imports of the name
written against Hermes' module layout keep working.
"""

from __future__ import annotations


class SessionPortabilityMixin:
    """Marker base of the export/import methods (they come from the housekeeping mixin)."""


__all__ = ["SessionPortabilityMixin"]
