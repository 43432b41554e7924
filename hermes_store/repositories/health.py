"""Read-only health facts for ``hermes-store doctor``: SQLite's own integrity check and
the size of each table and index, on a file or a server.

Only reads: the caller gives a read-only connection (a file opened ``mode=ro``, a
server transaction it rolls back), and nothing here writes or creates anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..models import Base
from .base import Repository

#: Lines of ``integrity_check`` kept: a badly damaged file can report thousands.
MAX_INTEGRITY_LINES = 20


@dataclass(frozen=True)
class ObjectSize:
    """One table or index and the bytes it takes (a server's table: with TOAST and indexes)."""

    name: str
    kind: str  # "table", "index"
    table: str
    bytes: int


class HealthRepository(Repository):
    """The facts are the dialect's statements (``integrity_check``, ``object_sizes``);
    this shapes them."""

    def integrity(self, *, quick: bool = False) -> list[str]:
        """SQLite's ``integrity_check`` (``quick_check`` with ``quick``): ``["ok"]`` when
        sound, else up to :data:`MAX_INTEGRITY_LINES` problems. A server has no such
        check of its own: ``[]``."""
        return self.dialect.integrity_check(self.conn, quick=quick, max_lines=MAX_INTEGRITY_LINES)

    def sizes(self) -> list[ObjectSize] | None:
        """Each table and index by size, largest first; None where the build has no
        ``dbstat`` table to ask (a file's total is still ``page_count × page_size``)."""
        rows = self.dialect.object_sizes(self.conn, self.schema, sorted(Base.metadata.tables))
        if rows is None:
            return None
        return [ObjectSize(str(name), "index" if kind == "index" else "table", str(table), int(size or 0))
                for name, kind, table, size in rows]
