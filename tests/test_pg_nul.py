"""U+0000 on PostgreSQL: psycopg's C text loaders stay, and the cursors decode per result.

Every way SQLAlchemy (and our copy) fetches rows is covered: fetchone, fetchmany,
fetchall, iteration, and a server-side cursor (``stream_results``), on rows where only
some columns and some values hold the stored form of NUL.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from hermes_store.codec import pg_encode_nul
from hermes_store.dialects.pg_nul import decode_rows
from hermes_store.engine import create_engine

#: Strings that exercise each branch of the mapping: NUL, both markers, escapes of the
#: markers, and text without any of them.
TRICKY = ["plain", "a\x00b", "\ue000", "\ue001", "\ue000\ue001\x00", "\x00json:[1]", "", "日本\x00語"]


@pytest.fixture
def engine(pg_database: str) -> Iterator[Engine]:
    eng = create_engine(pg_database)
    with eng.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (i int PRIMARY KEY, a text, b varchar, c text, n double precision)")
    yield eng
    eng.dispose()


def _fill(engine: Engine, values: list[str | None]) -> list[tuple]:
    rows = [(i, v, "same" if i % 2 else v, None if i % 3 else v, i * 0.5) for i, v in enumerate(values)]
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM t"))
        if rows:
            conn.execute(text("INSERT INTO t VALUES (:i, :a, :b, :c, :n)"),
                         [dict(zip("iabcn", r, strict=True)) for r in rows])
    return rows


def test_text_results_keep_the_c_loader(engine: Engine) -> None:
    with engine.connect() as conn:
        driver = conn.connection.driver_connection
        loader = driver.adapters.get_loader(25, 0)  # text, text format
        # The C implementation (psycopg_c / psycopg_binary), not a Python subclass of it.
        assert loader.__module__.split(".")[0] in {"psycopg_c", "psycopg_binary"}, loader
        assert type(driver.cursor()).__name__ == "NulCursor"


def test_every_fetch_path_decodes(engine: Engine) -> None:
    rows = _fill(engine, TRICKY * 30)
    query = text("SELECT i, a, b, c, n FROM t ORDER BY i")
    with engine.connect() as conn:
        assert [tuple(r) for r in conn.execute(query).all()] == rows
        assert tuple(conn.execute(query).first()) == rows[0]
        assert [tuple(r) for r in conn.execute(query)] == rows
        part = conn.execute(query)
        assert [tuple(r) for r in part.fetchmany(7)] + [tuple(r) for r in part.fetchmany(500)] == rows
        streamed = conn.execution_options(stream_results=True, yield_per=11).execute(query)
        assert [tuple(r) for r in streamed] == rows
        # the stored form really is the mapped one: no NUL reached the server
        assert conn.execute(text("SELECT count(*) FROM t WHERE strpos(a, chr(57345)) > 0")).scalar() > 0


def test_a_result_without_markers_is_returned_as_fetched(engine: Engine) -> None:
    _fill(engine, ["x", "y", "z"])
    with engine.connect() as conn:
        cursor = conn.connection.driver_connection.cursor()
        cursor.execute("SELECT a, b FROM t ORDER BY i")
        fetched = cursor.fetchall()
        cursor.execute("SELECT a, b FROM t ORDER BY i")
        assert decode_rows(cursor, fetched) is fetched  # the same list: nothing rebuilt


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.none(), st.text(alphabet=st.sampled_from("ab \x00\ue000\ue001語")), st.text()),
                max_size=12))
def test_any_text_round_trips(engine: Engine, values: list[str | None]) -> None:
    rows = _fill(engine, values)
    with engine.connect() as conn:
        got = [tuple(r) for r in conn.execute(text("SELECT i, a, b, c, n FROM t ORDER BY i"))]
        assert got == rows
        # and the stored form is exactly the encoder's
        raw = conn.connection.driver_connection.cursor()
        raw.execute("SELECT convert_to(a, 'UTF8') FROM t ORDER BY i")
        assert [bytes(r[0]).decode() if r[0] is not None else None for r in raw.fetchall()] == \
               [pg_encode_nul(v) if v is not None else None for v in values]
