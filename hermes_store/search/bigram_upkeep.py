"""Old import path of the short-CJK index's upkeep, kept only for modules that still use it.

The upkeep is :mod:`hermes_store.dialects.cjk_bigram`; this re-export goes once
``cli/doctor.py``, ``copying/copier.py`` and ``copying/plan.py`` import from there.
"""

from __future__ import annotations

from ..dialects.cjk_bigram import SETTLE_KEY, catch_up, pending, rebuild, settled_top

__all__ = ["SETTLE_KEY", "catch_up", "pending", "rebuild", "settled_top"]
