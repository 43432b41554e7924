"""U+0000 on PostgreSQL, on each psycopg connection (see :mod:`hermes_store.codec`).

Parameters: every ``str`` goes through :func:`pg_encode_nul` (a Python dumper; a call
binds a handful of them). Results keep psycopg's C text loaders. The decoding is done
per result: a cursor checks each text column of the rows it fetched (two substring
tests per value, done in C), and decodes only the columns, then only the values, that
hold a marker character. Nearly no stored text holds one, so a result costs no Python
call per value.
"""

from __future__ import annotations

import functools
import re
from operator import itemgetter
from typing import Any

from ..codec import pg_decode_nul, pg_encode_nul

#: OIDs of the types psycopg loads as ``str``: text, varchar, bpchar, name.
TEXT_OIDS = frozenset({25, 1043, 1042, 19})
#: Either marker character of the mapping; text without one is returned as loaded.
_MARKED = re.compile("[\ue000\ue001]").search
_ESC, _NUL = "\ue000", "\ue001"


def _text_columns(cursor: Any) -> list[int]:
    res = cursor.pgresult
    if res is None:
        return []
    return [i for i in range(res.nfields) if res.ftype(i) in TEXT_OIDS]


def _column_marked(values: Any) -> bool:
    """Whether a column's values hold a marker character: two substring tests per value,
    done in C (a regex over the joined column cost 1.3 ms of a 500-row replay)."""
    for value in values:
        if value and (_ESC in value or _NUL in value):
            return True
    return False


def _marked_columns(rows: list[Any], columns: list[int]) -> list[int]:
    try:
        return [i for i in columns if _column_marked(map(itemgetter(i), rows))]
    except TypeError:  # bytes, not str (an SQL_ASCII database): check each value
        return [i for i in columns if any(isinstance(r[i], str) and _MARKED(r[i]) for r in rows)]


def decode_rows(cursor: Any, rows: list[Any]) -> list[Any]:
    """``rows`` with the stored form of NUL decoded in the text columns that hold one."""
    if not rows:
        return rows
    marked = _marked_columns(rows, _text_columns(cursor))
    if not marked:
        return rows
    out = []
    for row in rows:
        if any(isinstance(row[i], str) and _MARKED(row[i]) for i in marked):
            fixed = list(row)
            for i in marked:
                fixed[i] = pg_decode_nul(fixed[i])
            row = tuple(fixed)
        out.append(row)
    return out


class _Decoding:
    """The fetch methods of a psycopg cursor, with :func:`decode_rows` applied."""

    def fetchone(self) -> Any:
        row = super().fetchone()  # type: ignore[misc]
        return row if row is None else decode_rows(self, [row])[0]

    def fetchmany(self, size: int = 0) -> list[Any]:
        return decode_rows(self, super().fetchmany(size))  # type: ignore[misc]

    def fetchall(self) -> list[Any]:
        return decode_rows(self, super().fetchall())  # type: ignore[misc]

    def __next__(self) -> Any:
        return decode_rows(self, [super().__next__()])[0]  # type: ignore[misc]


class _AsyncDecoding:
    """The same for psycopg's asyncio cursors (SQLAlchemy's async psycopg dialect)."""

    async def fetchone(self) -> Any:
        row = await super().fetchone()  # type: ignore[misc]
        return row if row is None else decode_rows(self, [row])[0]

    async def fetchmany(self, size: int = 0) -> list[Any]:
        return decode_rows(self, await super().fetchmany(size))  # type: ignore[misc]

    async def fetchall(self) -> list[Any]:
        return decode_rows(self, await super().fetchall())  # type: ignore[misc]

    async def __anext__(self) -> Any:
        return decode_rows(self, [await super().__anext__()])[0]  # type: ignore[misc]


@functools.cache
def _classes() -> dict[str, type]:
    # psycopg is an optional extra: its classes are subclassed on first use, not at import.
    import psycopg
    from psycopg.types.string import StrDumperUnknown

    class NulDumper(StrDumperUnknown):
        def dump(self, obj: str) -> Any:
            return super().dump(pg_encode_nul(obj))

    class NulCursor(_Decoding, psycopg.Cursor):
        pass

    class NulServerCursor(_Decoding, psycopg.ServerCursor):
        pass

    class AsyncNulCursor(_AsyncDecoding, psycopg.AsyncCursor):
        pass

    class AsyncNulServerCursor(_AsyncDecoding, psycopg.AsyncServerCursor):
        pass

    return {"dumper": NulDumper, "sync": NulCursor, "sync_server": NulServerCursor,
            "async": AsyncNulCursor, "async_server": AsyncNulServerCursor,
            "async_connection": psycopg.AsyncConnection}


def install_nul_adapters(dbapi_conn: Any) -> None:
    """Make this psycopg connection encode U+0000 on the way in and decode it on the way out.

    Every ``str`` parameter and every text result (content, JSON columns, titles, ids and
    query strings alike) uses the same reversible mapping, so a search term is encoded
    like the stored text it must match. ``dbapi_conn`` is psycopg's connection, or
    SQLAlchemy's adapter over an asyncio one. Idempotent.
    """
    driver = getattr(dbapi_conn, "driver_connection", dbapi_conn)
    if getattr(driver, "adapters", None) is None or getattr(driver, "_hermes_store_nul", False):
        return
    kinds = _classes()
    flavour = "async" if isinstance(driver, kinds["async_connection"]) else "sync"
    driver.adapters.register_dumper(str, kinds["dumper"])
    driver.cursor_factory = kinds[flavour]
    driver.server_cursor_factory = kinds[f"{flavour}_server"]
    try:
        driver._hermes_store_nul = True
    except AttributeError:
        pass
