"""Read-only health facts for ``hermes-store doctor``: SQLite's own integrity check and
the size of each table and index, on a file or a server.

Only reads: the caller gives a read-only connection (a file opened ``mode=ro``, a
server transaction it rolls back), and nothing here writes or creates anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import bindparam
from sqlalchemy.exc import OperationalError

from ..models import Base
from ..tenancy import SchemaSQL
from .base import Repository

#: Lines of ``integrity_check`` kept: a badly damaged file can report thousands.
MAX_INTEGRITY_LINES = 20

#: Every b-tree of a file by the bytes of its pages (``dbstat``: compiled into most builds).
_FILE_SIZES = (
    "SELECT s.name, COALESCE(m.type, 'table'), COALESCE(m.tbl_name, s.name), SUM(s.pgsize)"
    " FROM dbstat s LEFT JOIN sqlite_master m ON m.name = s.name"
    " GROUP BY s.name ORDER BY SUM(s.pgsize) DESC, s.name"
)
#: Our tables (with their TOAST and indexes) and each of their indexes, in the schema we work in.
_SERVER_SIZES = SchemaSQL(
    "SELECT c.relname, CASE WHEN c.relkind = 'i' THEN 'index' ELSE 'table' END, COALESCE(t.relname, c.relname),"
    " CASE WHEN c.relkind = 'i' THEN pg_relation_size(c.oid) ELSE pg_total_relation_size(c.oid) END"
    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " LEFT JOIN pg_index i ON i.indexrelid = c.oid LEFT JOIN pg_class t ON t.oid = i.indrelid"
    " WHERE n.nspname = COALESCE(:schema, current_schema()) AND c.relkind IN ('r', 'p', 'm', 'i')"
    " AND COALESCE(t.relname, c.relname) IN :names"
    " ORDER BY 4 DESC, 1",
    bindparam("names", expanding=True),
)


@dataclass(frozen=True)
class ObjectSize:
    """One table or index and the bytes it takes (a server's table: with TOAST and indexes)."""

    name: str
    kind: str  # "table", "index"
    table: str
    bytes: int


class HealthRepository(Repository):
    def integrity(self, *, quick: bool = False) -> list[str]:
        """SQLite's ``integrity_check`` (``quick_check`` with ``quick``): ``["ok"]`` when
        sound, else up to :data:`MAX_INTEGRITY_LINES` problems. A server has no such
        check of its own: ``[]``."""
        if not self.dialect.is_file:
            return []
        pragma = "quick_check" if quick else "integrity_check"
        rows = self.conn.exec_driver_sql(f"PRAGMA {pragma}({MAX_INTEGRITY_LINES})").fetchall()
        return [str(r[0]) for r in rows]

    def sizes(self) -> list[ObjectSize] | None:
        """Each table and index by size, largest first; None where the build has no
        ``dbstat`` table to ask (a file's total is still ``page_count × page_size``)."""
        if self.dialect.is_file:
            try:
                rows = self.conn.exec_driver_sql(_FILE_SIZES).fetchall()
            except OperationalError as exc:
                if "dbstat" in str(exc):
                    return None
                raise
        else:
            rows = self.conn.execute(_SERVER_SIZES.on(self.conn),
                                     {"schema": self.schema, "names": sorted(Base.metadata.tables)}).fetchall()
        return [ObjectSize(str(name), "index" if kind == "index" else "table", str(table), int(size or 0))
                for name, kind, table, size in rows]
