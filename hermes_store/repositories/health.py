"""Read-only health facts for ``hermes-store doctor`` and ``hermes-store size``: SQLite's
own integrity check, the size of each table and index, and where the bytes are (each
search index's share, free pages, what VACUUM and an FTS optimize would give back), on a
file or a server.

Only reads: the caller gives a read-only connection (a file opened ``mode=ro``, a
server transaction it rolls back), and nothing here writes or creates anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..dialects.fts5 import FTS_SHADOWS
from ..models import Base
from ..search.cjk_pairs import DIRTY_TABLE as BIGRAM_DIRTY_TABLE, TABLE as BIGRAM_TABLE
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

    def space(self) -> dict[str, Any]:
        """Where the bytes are, JSON-ready (``hermes-store size``): :meth:`sizes` grouped
        into tables (with their indexes) and search indexes (an FTS5 index with its shadow
        tables, a server's GIN index, the short-CJK bigram tables), each with its share of
        the total; free pages; and what VACUUM and an FTS optimize would give back, each
        figure labelled ``exact`` or ``estimate`` in the ``how`` beside it."""
        objects = self.sizes()
        details = self.dialect.space_details(self.conn, self.schema, sorted(Base.metadata.tables))
        flat = _own_bytes(objects or [], set(self.dialect.fts_indexes(self.conn)),
                          bool(details.get("table_bytes_include_indexes")))
        used = sum(o["bytes"] for o in flat)
        page_size = details.get("page_size")
        free: int | None = None
        total = used
        if page_size is not None:
            total = int(details["page_count"]) * int(page_size)
            free = int(details.get("freelist_pages") or 0) * int(page_size)
            if objects is None:
                used = total - free
        tables, indexes = _grouped(flat)
        search = set(self.dialect.fts_indexes(self.conn)) if objects is None else set()
        segments: dict[str, list[tuple[int, int, int]]] = details.get("fts_segments", {})
        for name in sorted(set(segments) | search):
            indexes.setdefault(name, {"name": name, "bytes": None, "parts": []})
        optimize = _optimize_reclaim(indexes, segments)
        for entry in [*tables.values(), *indexes.values()]:
            entry["share"] = None if entry["bytes"] is None or not total else round(entry["bytes"] / total, 4)
        rows: dict[str, tuple[int, int]] = details.get("rows", {})
        return {
            "exact": objects is not None,
            "method": ("dbstat" if objects is not None else "page counts") if page_size is not None
            else "pg_total_relation_size",
            "total_bytes": total, "used_bytes": used, "free_bytes": free,
            "page_size": page_size, "page_count": details.get("page_count"),
            "free_pages": details.get("freelist_pages"),
            "tables": sorted(tables.values(), key=lambda t: (-t["bytes"], t["name"])),
            "search_indexes": sorted(indexes.values(), key=lambda i: (-(i["bytes"] or 0), i["name"])),
            "objects": flat,
            "reclaim": {"vacuum": _vacuum_reclaim(free, details.get("slack_bytes"), rows, flat),
                        "fts_optimize": optimize},
            "rows": {t: {"live": n, "dead": d} for t, (n, d) in sorted(rows.items())} or None,
        }


def _search_index_of(o: ObjectSize, search: set[str]) -> str | None:
    """The search index an object is part of: an FTS5 index's shadow tables, a server's
    GIN index itself, the short-CJK bigram tables and their indexes; None for the rest."""
    for name in (o.name, o.table):
        if name in search:
            return name
        stem = name.rsplit("_", 1)[0]
        if name.endswith(FTS_SHADOWS) and stem in search:
            return stem
        if name in (BIGRAM_TABLE, BIGRAM_DIRTY_TABLE):
            return BIGRAM_TABLE
    return None


def _own_bytes(objects: list[ObjectSize], search: set[str], with_indexes: bool) -> list[dict[str, Any]]:
    """Each b-tree by its own bytes (a server's table total counts its indexes: taken out)."""
    index_bytes: dict[str, int] = {}
    for o in objects:
        if o.kind == "index":
            index_bytes[o.table] = index_bytes.get(o.table, 0) + o.bytes
    return [{"name": o.name, "kind": o.kind, "table": o.table, "search_index": _search_index_of(o, search),
             "bytes": o.bytes - index_bytes.get(o.name, 0) if o.kind == "table" and with_indexes else o.bytes}
            for o in objects]


def _grouped(flat: list[dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Tables with their indexes, and search indexes with their parts."""
    tables: dict[str, dict[str, Any]] = {}
    indexes: dict[str, dict[str, Any]] = {}
    for o in flat:
        name = o["search_index"]
        if name is not None:
            entry = indexes.setdefault(name, {"name": name, "bytes": 0, "parts": []})
            entry["bytes"] += o["bytes"]
            entry["parts"].append({"name": o["name"], "kind": o["kind"], "bytes": o["bytes"]})
            continue
        owner = o["table"] if o["kind"] == "index" else o["name"]
        t = tables.setdefault(owner, {"name": owner, "table_bytes": 0, "index_bytes": 0, "indexes": []})
        if o["kind"] == "index":
            t["index_bytes"] += o["bytes"]
            t["indexes"].append({"name": o["name"], "bytes": o["bytes"]})
        else:
            t["table_bytes"] += o["bytes"]
    for t in tables.values():
        t["bytes"] = t["table_bytes"] + t["index_bytes"]
    for entry in indexes.values():
        entry["bytes_how"] = "exact"
    return tables, indexes


def _optimize_reclaim(indexes: dict[str, dict[str, Any]],
                      segments: dict[str, list[tuple[int, int, int]]]) -> dict[str, Any]:
    """Per FTS5 index: its segments and what an optimize frees (0, exactly, when it is one
    segment already; otherwise not estimated: what merging frees depends on the terms the
    segments share and the deleted rows' entries they hold, which only doing it tells,
    and ``hermes-store size --exact`` does it on a private copy)."""
    unknown = 0
    for entry in indexes.values():
        segs = segments.get(entry["name"])
        entry["segments"] = None if segs is None else len(segs)
        entry["optimize_reclaim_bytes"], entry["optimize_reclaim_how"] = None, None
        if segs is None:
            continue
        if entry["bytes"] is None:  # no dbstat: the segments' payload is all there is to go on
            entry["bytes"] = sum(b for _, _, b in segs)
            entry["bytes_how"] = "estimate: the payload of its _data table's segments"
        if len(segs) <= 1:
            entry["optimize_reclaim_bytes"], entry["optimize_reclaim_how"] = 0, "exact: one segment already"
        else:
            unknown += 1
            entry["optimize_reclaim_how"] = (f"not estimated: {len(segs)} segments would merge into one; what that "
                                             "frees depends on shared terms and deleted rows (--exact measures it)")
    if not segments:
        return {"bytes": None, "how": "not measured: a server's GIN indexes only merge their pending list"
                if indexes else None}
    if unknown:
        return {"bytes": None, "how": f"not estimated: {unknown} search index(es) of several segments "
                                      "(--exact measures it)"}
    return {"bytes": 0, "how": "exact: every search index is one segment already"}


def _vacuum_reclaim(free: int | None, slack: int | None, rows: dict[str, tuple[int, int]],
                    flat: list[dict[str, Any]]) -> dict[str, Any]:
    """What VACUUM gives back: a file's free pages (exact) and at most the unused bytes of
    its partly filled pages; a server's dead rows' share of each table (the statistics
    collector's estimate)."""
    if free is not None:
        return {"bytes": free, "at_most": None if slack is None else free + slack,
                "how": "estimate: at least the free pages (exact); VACUUM also repacks partly filled pages, "
                       "at most their unused bytes (--exact measures it)"}
    own = {o["name"]: o["bytes"] for o in flat if o["kind"] == "table"}
    if rows:
        dead = sum(int(own.get(t, 0) * d / (n + d)) for t, (n, d) in rows.items() if n + d)
        return {"bytes": dead, "at_most": None,
                "how": "estimate: each table's bytes × its dead-row share (pg_stat_user_tables); VACUUM makes "
                       "it reusable, VACUUM FULL gives it back"}
    return {"bytes": None, "at_most": None, "how": "unknown"}
