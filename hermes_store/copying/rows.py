"""Reading rows on either side of a copy, the same way for both: table columns both
sides have, keyset pages of a primary key, lookups by key in bounded IN lists."""

from __future__ import annotations

from typing import Any
from collections.abc import Iterable, Iterator, Sequence

from sqlalchemy import Connection, func, literal, or_, select, tuple_

from ..dialects import for_connection
from ..repositories.base import ID_CHUNK
from .plan import TABLES, CopyReport

S, M, U, P = (TABLES[n] for n in ("sessions", "messages", "session_model_usage", "system_prompts"))


class CopyRows:
    """The two connections of one run and the row reads the copy and its check share."""

    def __init__(self, src: Connection, dst: Connection, report: CopyReport, *, merge: bool) -> None:
        self.src, self.dst = src, dst
        self.report, self.merge = report, merge
        self.src_dialect, self.dst_dialect = for_connection(src), for_connection(dst)
        self.cols: dict[str, list[str] | None] = {}
        self.ucols: list[str] | None = None

    def columns(self, name: str) -> list[str] | None:
        """Columns of ``name`` both sides have and the model knows (None: not in the source)."""
        if name not in self.cols:
            model = TABLES[name]
            have = [r[0] for r in self.src_dialect.table_info(self.src, name)]
            if not have:
                self.cols[name] = None
                return None
            dest = {r[0] for r in self.dst_dialect.table_info(self.dst, name)}
            unknown = sorted(c for c in have if c not in model.c)
            if unknown:
                self.report.skipped_columns[name] = unknown
            self.cols[name] = [c for c in model.c.keys() if c in have and c in dest]
        return self.cols[name]

    def _present(self, conn: Connection, column: Any, values: Iterable[Any]) -> set[Any]:
        """Which of ``values`` ``column`` holds (IN lists of at most ID_CHUNK)."""
        wanted = [v for v in dict.fromkeys(values) if v is not None]
        found: set[Any] = set()
        for start in range(0, len(wanted), ID_CHUNK):
            chunk = wanted[start:start + ID_CHUNK]
            found.update(r[0] for r in conn.execute(select(column).where(column.in_(chunk))))
        return found

    def _pages(self, name: str, cols: Sequence[str], size: int) -> Iterator[list[tuple[Any, ...]]]:
        """Source rows of ``name`` in keyset pages of its primary key (rows with a NULL key left out)."""
        table = TABLES[name]
        key = [c.name for c in table.primary_key.columns]
        at = [list(cols).index(k) for k in key]
        base = select(*(table.c[c] for c in cols)).where(*(table.c[k].is_not(None) for k in key))
        base = base.order_by(*(table.c[k] for k in key)).limit(size)
        last: tuple[Any, ...] | None = None
        while True:
            query = base
            if last is not None:
                if len(key) == 1:
                    query = query.where(table.c[key[0]] > last[0])
                else:
                    after = tuple_(*(literal(v, table.c[k].type) for k, v in zip(key, last, strict=True)))
                    query = query.where(tuple_(*(table.c[k] for k in key)) > after)
            rows = [tuple(r) for r in self.src.execute(query)]
            if not rows:
                return
            yield rows
            if len(rows) < size:
                return
            last = tuple(rows[-1][i] for i in at)

    def _count(self, conn: Connection, name: str, where: Any = None) -> int:
        query = select(func.count()).select_from(TABLES[name])
        if where is not None:
            query = query.where(where)
        return int(conn.execute(query).scalar() or 0)

    def _null_keys(self, name: str) -> Any:
        return or_(*(k.is_(None) for k in TABLES[name].primary_key.columns))

    def _lookup(self, conn: Connection, name: str, cols: Sequence[str],
                keys: Sequence[tuple[Any, ...]]) -> dict[tuple[Any, ...], dict[str, Any]]:
        """The rows ``conn`` holds for these primary keys, by key."""
        table = TABLES[name]
        key = [c.name for c in table.primary_key.columns]
        column = table.c[key[0]] if len(key) == 1 else tuple_(*(table.c[k] for k in key))
        found: dict[tuple[Any, ...], dict[str, Any]] = {}
        for start in range(0, len(keys), ID_CHUNK):
            chunk = keys[start:start + ID_CHUNK]
            values = [k[0] for k in chunk] if len(key) == 1 else list(chunk)
            for r in conn.execute(select(*(table.c[c] for c in cols)).where(column.in_(values))):
                row = dict(zip(cols, r, strict=True))
                found[tuple(row[k] for k in key)] = row
        return found
