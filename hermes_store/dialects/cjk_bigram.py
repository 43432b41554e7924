"""The short-CJK index in the database: its reads for search and keeping it current.

The index itself (pairs per block, statement text) is pure, in
:mod:`hermes_store.search.cjk_pairs`; here it meets a connection: whether it is there,
its high-water mark, pair counts (cached per engine and schema), catch-up, rebuild,
coverage. Where writers run side by side is the connection's dialect's to say.

Each call runs inside a write transaction of the caller's (a store's upkeep, an
import, ``index_search``). Rows the index does not cover yet are still found, by a
direct scan, so this is about speed, never about results, except for one rule:
the high-water mark may only pass ids that can no longer appear below it.

Where writers run side by side (PostgreSQL), an id is drawn when an INSERT runs, but
the row only shows when its transaction commits: id 100 can appear after 101 was
indexed, under the mark and outside the index. So a catch-up notes the newest committed
id together with the transactions writing into ``messages`` at that moment
(``SETTLE_KEY``). Once those have all ended, every id up to the note is final, and the
mark may move up to it; a later catch-up (or the same one, when no writer was busy)
does so. With one writer at a time (SQLite's write lock) every id is final at once.
"""

from __future__ import annotations

import re
import weakref
from typing import Any
from collections.abc import Iterable, Sequence

from sqlalchemy import text

from ..keys import BIGRAM_SETTLE_KEY, MAX_ROWS
from ..search.cjk_pairs import (  # noqa: F401 - the pure half, importable from here with the rest
    BLOCK,
    DIRTY_TABLE,
    HIGH_WATER_KEY,
    TABLE,
    bigrams,
    candidate_blocks_sql,
    pair_counts_sql,
    parse_high_water,
    term_bigrams,
)
from ..tenant_schema import SchemaSQL, qualified, render, schema_of_connection
from . import for_connection

#: ``"<settled> <top>:<transaction>,…"``: the id every id up to which is final, then the
#: newest committed id when last noted and the transactions writing then, waiting to
#: settle (``"<settled> :"`` when nothing waits; see the module docstring).
SETTLE_KEY = BIGRAM_SETTLE_KEY
_NOTE = re.compile(r"(-?[0-9]{1,18}) (-?[0-9]{1,18})?:([0-9/,]*)")

_TAIL = SchemaSQL("SELECT count(*) FROM {messages} WHERE id > :hw")
_META = SchemaSQL("SELECT value FROM {state_meta} WHERE key = :k")
_DIRTY_COUNT = SchemaSQL(f"SELECT count(*) FROM {{{DIRTY_TABLE}}}")
_CLEAR_DIRTY = SchemaSQL(f"DELETE FROM {{{DIRTY_TABLE}}}")
_CLEAR_INDEX = SchemaSQL(f"DELETE FROM {{{TABLE}}}")
_DROP_BLOCK = SchemaSQL(f"DELETE FROM {{{TABLE}}} WHERE block = :b")
_BLOCK_ROWS = SchemaSQL(
    "SELECT id, content, tool_name, tool_calls FROM {messages} WHERE id BETWEEN :lo AND :hi AND id <= :hw"
)
_TAIL_ROWS = SchemaSQL(
    "SELECT id, content, tool_name, tool_calls FROM {messages} WHERE id > :hw AND id <= :top ORDER BY id LIMIT :n"
)
_BEHIND = SchemaSQL(
    "SELECT (SELECT value FROM {state_meta} WHERE key = :k), (SELECT max(id) FROM {messages}),"
    f" EXISTS (SELECT 1 FROM {{{DIRTY_TABLE}}})"
)
#: What a catch-up reads first, in one statement: the dirty blocks (no key), the two
#: notes by key, and the newest id (key ``#top``: never a note's key).
_START = SchemaSQL(
    f"SELECT NULL, CAST(block AS TEXT) FROM {{{DIRTY_TABLE}}}"
    " UNION ALL SELECT key, value FROM {state_meta} WHERE key IN (:hw_key, :settle_key)"
    " UNION ALL SELECT '#top', CAST(max(id) AS TEXT) FROM {messages}"
)
_SET_TWO_META = SchemaSQL(
    "INSERT INTO {state_meta} (key, value) VALUES (:k, :v), (:k2, :v2)"
    " ON CONFLICT(key) DO UPDATE SET value = excluded.value"
)
_SET_META = SchemaSQL(
    "INSERT INTO {state_meta} (key, value) VALUES (:k, :v) ON CONFLICT(key) DO UPDATE SET value = excluded.value"
)
#: Tail rows read per statement.
CHUNK = 5000
#: An id larger than any: no cap (every committed id is final).
_NO_CAP = MAX_ROWS


#: Per engine and tenant schema: the high-water mark the cached pair counts were read
#: at, and the counts (tenants sharing an engine each have their own index).
_COUNTS: weakref.WeakKeyDictionary[Any, dict[str | None, tuple[int, dict[str, int]]]] = weakref.WeakKeyDictionary()
_MAX_CACHED = 4096
_HIGH_WATER = SchemaSQL("SELECT value FROM {state_meta} WHERE key = :k")


def high_water(conn: Any) -> int:
    row = conn.execute(_HIGH_WATER.on(conn), {"k": HIGH_WATER_KEY}).first()
    return parse_high_water(row[0] if row else None)


def installed(conn: Any) -> bool:
    """Whether the connection's schema has the bigram index table."""
    return for_connection(conn).has_table(conn, TABLE)


#: Per engine: the schemas whose index table was seen (only a True is kept: the table
#: appears through a migration; a drop or a downgrade shows as an error of the next
#: catch-up, which forgets it, see :func:`catch_up`).
_INSTALLED: weakref.WeakKeyDictionary[Any, set[str | None]] = weakref.WeakKeyDictionary()


def seen_installed(conn: Any) -> bool:
    """:func:`installed`, asked of the server until it first says yes for this engine
    and schema: the periodic catch-up asks it every run, and the answer only changes
    through a migration."""
    engine = getattr(conn, "engine", None)
    schema = schema_of_connection(conn)
    seen = _INSTALLED.get(engine) if engine is not None else None
    if seen is not None and schema in seen:
        return True
    if not installed(conn):
        return False
    if engine is not None:
        _INSTALLED.setdefault(engine, set()).add(schema)
    return True


def forget_installed(conn: Any) -> None:
    """Ask the server again next time (a catch-up failed: the table may be gone)."""
    engine = getattr(conn, "engine", None)
    seen = _INSTALLED.get(engine) if engine is not None else None
    if seen is not None:
        seen.discard(schema_of_connection(conn))


def behind(conn: Any) -> bool:
    """Whether the index has anything to catch up on (``pending(conn) > 0``), in one
    statement: the mark, the newest id and whether any block is dirty."""
    mark, top, dirty = conn.execute(_BEHIND.on(conn), {"k": HIGH_WATER_KEY}).one()
    return bool(dirty) or (top is not None and int(top) > parse_high_water(mark))


def pending(conn: Any) -> int:
    """How many messages the index does not cover yet (tail rows + dirty blocks' rows)."""
    hw = high_water(conn)
    tail = conn.execute(_TAIL.on(conn), {"hw": hw}).scalar()
    dirty = conn.execute(_DIRTY_COUNT.on(conn)).scalar()
    return int(tail) + int(dirty) * BLOCK


def _index_rows(conn: Any, rows: Iterable[Sequence[Any]]) -> int:
    """Add the pairs of ``rows`` (id, texts…) to the index; returns the highest id seen."""
    grams_by_block: dict[int, set[str]] = {}
    top = -1
    for mid, *texts in rows:
        block = mid // BLOCK
        grams = grams_by_block.get(block)
        if grams is None:
            grams = grams_by_block[block] = set()
        for value in texts:
            if value:
                grams |= bigrams(value)
        if mid > top:
            top = mid
    if grams_by_block:
        _add_pairs(conn, [(g, b) for b, grams in grams_by_block.items() for g in grams])
    return top


def _add_pairs(conn: Any, pairs: list[tuple[str, int]]) -> None:
    if pairs:
        for_connection(conn).add_bigram_pairs(conn, qualified(schema_of_connection(conn), TABLE), pairs)


def _meta(conn: Any, key: str) -> str | None:
    row = conn.execute(_META.on(conn), {"k": key}).first()
    return row[0] if row else None


def _set_meta(conn: Any, key: str, value: str) -> None:
    conn.execute(_SET_META.on(conn), {"k": key, "v": value})


def _read_note(value: str | None) -> tuple[int, int | None, list[str]]:
    """``(settled, noted top or None, its writers)`` of a stored note (junk: nothing settled)."""
    note = _NOTE.fullmatch(value or "")
    if note is None:
        return -1, None, []
    pending = None if note.group(2) is None else int(note.group(2))
    return int(note.group(1)), pending, [w for w in note.group(3).split(",") if w]


def _settle(conn: Any, stored: str | None, top: int) -> tuple[int, str | None]:
    """The highest id below which no new row can appear any more (see the module
    docstring), and the note to store in its place (None: unchanged).

    The note holds what settled already and what waits to: the top noted last time,
    with its writers. Once they have ended it settles and a new top is noted, settled
    at once when nobody is writing now. ``top`` (the newest committed id) was read
    before the writers are: an id drawn below it by a transaction still open then is
    among them.
    """
    dialect = for_connection(conn)
    settled, noted, writers = _read_note(stored)
    if noted is not None:
        if dialect.still_running(conn, writers):
            return settled, None
        settled = max(settled, noted)
    found = dialect.writers_in_progress(conn, "messages")
    if found is None:
        return _NO_CAP, None  # no writer runs beside this transaction: every id is final
    writers = found
    if writers:
        value = f"{settled} {top}:{','.join(writers)}"
    else:
        settled, value = max(settled, top), f"{max(settled, top)} :"
    return settled, (value if value != stored else None)


def catch_up(conn: Any, limit: int | None = None) -> int:
    """Index dirty blocks and settled rows above the high-water mark; returns rows indexed.

    ``limit`` bounds the number of tail rows handled in this call (None: all). The
    blocks, both notes and the newest id come in one statement, and the notes go back
    in one at the end (one transaction: nobody sees them apart or halfway). A failure forgets
    that the table was seen (:func:`seen_installed`): it may have been dropped.
    """
    if not seen_installed(conn):
        return 0
    try:
        return _catch_up(conn, limit)
    except Exception:
        forget_installed(conn)
        raise


def _catch_up(conn: Any, limit: int | None) -> int:
    dirty: list[int] = []
    notes: dict[str, str | None] = {}
    top = -1
    for key, value in conn.execute(_START.on(conn), {"hw_key": HIGH_WATER_KEY, "settle_key": SETTLE_KEY}):
        if key is None:
            dirty.append(int(value))
        elif key == "#top":
            top = -1 if value is None else int(value)
        else:
            notes[key] = value
    hw = parse_high_water(notes.get(HIGH_WATER_KEY))
    if not dirty and top <= hw:
        return 0  # nothing behind (:func:`behind`): the notes stay as they are
    done = 0
    for block in dirty:
        conn.execute(_DROP_BLOCK.on(conn), {"b": block})
        rows = conn.execute(
            _BLOCK_ROWS.on(conn), {"lo": block * BLOCK, "hi": block * BLOCK + BLOCK - 1, "hw": hw}
        ).fetchall()
        _index_rows(conn, rows)
        done += len(rows)
    if dirty:
        conn.execute(_CLEAR_DIRTY.on(conn))
    cap, note = _settle(conn, notes.get(SETTLE_KEY), top)
    start = hw
    while limit is None or done < limit:
        rows = conn.execute(_TAIL_ROWS.on(conn), {"hw": hw, "top": cap, "n": CHUNK}).fetchall()
        if not rows:
            break
        hw = _index_rows(conn, rows)
        done += len(rows)
        if len(rows) < CHUNK:
            break  # every row up to the cap was read: ids under it are final (or the write lock is ours)
    if hw != start and note is not None:
        conn.execute(_SET_TWO_META.on(conn), {"k": HIGH_WATER_KEY, "v": str(hw), "k2": SETTLE_KEY, "v2": note})
    elif hw != start:
        _set_meta(conn, HIGH_WATER_KEY, str(hw))
    elif note is not None:
        _set_meta(conn, SETTLE_KEY, note)
    return done


def rebuild(conn: Any) -> int:
    """Drop and rebuild the whole index from the messages table."""
    if not installed(conn):
        return 0
    conn.execute(_CLEAR_INDEX.on(conn))
    conn.execute(_CLEAR_DIRTY.on(conn))
    _set_meta(conn, HIGH_WATER_KEY, "-1")
    return catch_up(conn)


def _cached(conn: Any) -> tuple[dict[str | None, tuple[int, dict[str, int]]], str | None]:
    """The pair counts kept for ``conn``'s engine (per schema), and its schema."""
    engine = getattr(conn, "engine", None)
    per_schema = _COUNTS.setdefault(engine, {}) if engine is not None else {}
    return per_schema, schema_of_connection(conn)


def missing_pairs(conn: Any, term_grams: Sequence[Sequence[str]]) -> list[str]:
    """The pairs whose counts are not kept for the mark last seen: what a caller that
    reads the high-water mark anyway reads with it (:func:`pair_counts_sql`)."""
    per_schema, schema = _cached(conn)
    cached = per_schema.get(schema)
    known = cached[1] if cached is not None else {}
    return sorted({g for grams in term_grams for g in grams} - known.keys())


def estimate_blocks(conn: Any, term_grams: Sequence[Sequence[str]], *, mark: int | None = None,
                    counts: dict[str, int] | None = None) -> int:
    """Upper bound of candidate blocks: per term, the rarest pair's block count.

    Pair counts only change when the index catches up, which moves the high-water mark,
    so they are kept per engine for the mark they were read at: a search reads only the
    pairs it has not seen yet, all in one query. A count that went stale otherwise (a
    dirty block re-indexed) only steers the choice between two correct plans. A caller
    that read the high-water mark already passes it as ``mark``, and the ``counts`` it
    read with it (:func:`missing_pairs`), saving the round trips.
    """
    if mark is None:
        mark = high_water(conn)
    per_schema, schema = _cached(conn)
    cached = per_schema.get(schema)
    known = cached[1] if cached is not None and cached[0] == mark else {}
    if counts:
        known.update(counts)
    missing = sorted({g for grams in term_grams for g in grams} - known.keys())
    if missing:
        if len(known) + len(missing) > _MAX_CACHED:
            known = {g: n for g, n in known.items() if any(g in grams for grams in term_grams)}
        names = {f"g{i}": g for i, g in enumerate(missing)}
        found = dict(conn.execute(text(render(
            f"SELECT gram, count(*) FROM {{{TABLE}}} WHERE gram IN ({', '.join(':' + n for n in names)}) GROUP BY gram",
            schema,
        )), names).all())
        known.update({g: int(found.get(g, 0)) for g in missing})
    if len(known) > _MAX_CACHED:
        known = {g: known[g] for grams in term_grams for g in grams}
    per_schema[schema] = (mark, known)
    return sum(min(known[g] for g in grams) for grams in term_grams if grams)
