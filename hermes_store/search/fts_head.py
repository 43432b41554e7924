"""The FTS objects of our head schema, as a fresh SQLite file gets them.

Kept out of the dialects: reading them means running our migrations, and the
migrations import the dialects (a dialect importing them back would be a cycle).
Callers hand the result to ``Fts5Storage.demote_legacy``.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

from .. import migrations
from ..dialects.fts5 import FtsObject, fts_objects_of


@functools.lru_cache(maxsize=1)
def head_fts_objects() -> tuple[FtsObject, ...]:
    """(type, name, CREATE) of every FTS object our head schema has, in creation order.

    Read from a database our migrations build (once per process), so the layout a
    demotion creates is exactly what a fresh file gets: views, then the virtual
    tables, then the triggers that feed them (the CJK index is not ours).
    """
    with tempfile.TemporaryDirectory(prefix="hermes-store-fts-") as tmp:
        path = Path(tmp) / "head.db"
        migrations.upgrade(path)
        return fts_objects_of(path)
