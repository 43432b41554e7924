"""PostgreSQL benchmark databases: the generated SQLite corpus copied into a fresh database.

    python bench/pg_load.py 10k                  # load (prints the database name) and keep it
    python bench/pg_load.py --drop hb_10k_ab12cd  # drop one

``bench/run.py --backend postgresql`` uses :func:`load` for every run: it creates a new
database on the server, migrates it to head with ``hermes_store.migrations.upgrade``
(revision hs0002 builds the PostgreSQL schema: the generated ``search_vector``, its
GIN index, the ``pg_trgm`` index and the short-CJK bigram tables), copies the rows of
the cached SQLite file with ``COPY`` and asks ``SessionDB.index_search()`` to build
the bigram index, as on a database ``SessionDB`` had written all along. The same
seeded corpus therefore backs both backends.

Loading speed only: the secondary indexes of ``messages`` are dropped before the
``COPY`` and recreated after it from their own definitions (``pg_get_indexdef``). The
triggers stay on, so every row is stored as an ``INSERT`` through the library's
schema would store it. The result is the same database, built faster. ``VACUUM
ANALYZE`` then leaves it as autovacuum would.

Write benchmarks need private copies: :func:`clone` makes one with ``CREATE DATABASE …
TEMPLATE`` (a file copy on the server).
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from collections.abc import Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (str(ROOT), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

#: Copied in this order (parents before children); other tables stay as head creates them.
TABLES = ("system_prompts", "sessions", "messages", "session_model_usage")
#: PostgreSQL's error for "the template has other sessions" (autovacuum, a closing pool).
OBJECT_IN_USE = "55006"


def default_url() -> str | None:
    import os

    return os.environ.get("HERMES_STORE_TEST_PG_URL")


def with_database(url: str, name: str) -> str:
    """The SQLAlchemy URL of database ``name`` on the server of ``url``."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(database=name).render_as_string(hide_password=False)


def conninfo(url: str) -> str:
    """A libpq URI for psycopg from a ``postgresql+psycopg://`` SQLAlchemy URL."""
    from sqlalchemy.engine import make_url

    # prepare_threshold is a psycopg setting the library takes from the URL (bench/run.py
    # --prepared), not a libpq parameter.
    plain = make_url(url).difference_update_query(["prepare_threshold"])
    return plain.set(drivername="postgresql").render_as_string(hide_password=False)


def _admin(url: str) -> Any:
    import psycopg

    return psycopg.connect(conninfo(url), autocommit=True)


def create_database(url: str, name: str, template: str | None = None, attempts: int = 20) -> str:
    """CREATE DATABASE ``name`` (optionally from ``template``); returns its URL.

    Copying a template fails while anything else is connected to it; autovacuum or a
    pool that is still closing can be, so that error is retried for a few seconds.
    """
    import psycopg

    sql = f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")
    with _admin(url) as conn:
        for attempt in range(attempts):
            try:
                conn.execute(sql)
                break
            except psycopg.errors.ObjectInUse:
                if attempt == attempts - 1:
                    raise
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND backend_type = 'autovacuum worker'", (template,))
                time.sleep(0.25)
    return with_database(url, name)


def drop_database(url: str, name: str) -> None:
    with _admin(url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def clone(url: str, source: str, name: str) -> str:
    """A private copy of database ``source`` named ``name``; returns its URL."""
    return create_database(url, name, template=source)


def server_version(url: str) -> str:
    with _admin(url) as conn:
        return str(conn.execute("SHOW server_version").fetchone()[0])


def server_settings(url: str) -> dict[str, str]:
    """Settings that change write figures a lot (fsync, synchronous_commit, ...)."""
    names = ("fsync", "synchronous_commit", "shared_buffers", "full_page_writes", "wal_level", "max_connections")
    with _admin(url) as conn:
        rows = conn.execute("SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
                            (list(names),)).fetchall()
    return dict(rows)


def _column_types(pg: Any, table: str) -> dict[str, tuple[int, str]]:
    """Storable columns of ``table`` (generated ones left out): name -> (type oid, type name)."""
    rows = pg.execute(
        "SELECT a.attname, a.atttypid, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' "
        "ORDER BY a.attnum", (table,)).fetchall()
    return {name: (oid, tname) for name, oid, tname in rows}


def _converter(type_name: str) -> Callable[[Any], Any]:
    """SQLite's loosely typed value as the PostgreSQL column wants it."""
    from hermes_store.codec import pg_encode_nul

    if type_name in ("bigint", "integer", "smallint"):
        return lambda v: int(v) if isinstance(v, float) and v.is_integer() else v
    if type_name == "double precision":
        return lambda v: float(v) if isinstance(v, int) else v
    if type_name == "bytea":
        return lambda v: v.encode("utf-8") if isinstance(v, str) else v

    def text(v: Any) -> Any:
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        return pg_encode_nul(v) if isinstance(v, str) else v

    return text


def _copy_table(src: sqlite3.Connection, pg: Any, table: str) -> int:
    src_cols = [r[1] for r in src.execute(f"PRAGMA table_info({table})")]
    if not src_cols:
        return 0
    types = _column_types(pg, table)
    cols = [c for c in src_cols if c in types]
    convert = [_converter(types[c][1]) for c in cols]
    order = {"sessions": " ORDER BY started_at, id", "messages": " ORDER BY id"}.get(table, "")
    n = 0
    with pg.cursor() as cur:
        with cur.copy(f"COPY {table} ({', '.join(cols)}) FROM STDIN (FORMAT BINARY)") as cp:
            cp.set_types([types[c][0] for c in cols])
            for row in src.execute(f"SELECT {', '.join(cols)} FROM {table}{order}"):
                cp.write_row([f(v) for f, v in zip(convert, row, strict=True)])
                n += 1
    return n


def load(sqlite_path: Path, url: str, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Migrate the (new, empty) database at ``url`` to head and copy ``sqlite_path`` into it."""
    import psycopg

    from hermes_store import SessionDB, migrations

    t0 = time.perf_counter()
    migrations.upgrade(url)
    stats: dict[str, Any] = {"rows": {}}
    src = sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True)
    try:
        with psycopg.connect(conninfo(url)) as pg:
            pg.execute("SET maintenance_work_mem = '256MB'")
            indexes = [r[0] for r in pg.execute(
                "SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i WHERE i.indrelid = 'messages'::regclass "
                "AND NOT i.indisprimary ORDER BY i.indexrelid").fetchall()]
            names = [r[0] for r in pg.execute(
                "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "WHERE i.indrelid = 'messages'::regclass AND NOT i.indisprimary").fetchall()]
            for name in names:
                pg.execute(f'DROP INDEX "{name}"')
            for table in TABLES:
                t = time.perf_counter()
                stats["rows"][table] = _copy_table(src, pg, table)
                progress(f"  postgresql: copied {stats['rows'][table]:,} {table} rows "
                         f"({time.perf_counter() - t:.1f}s)")
            t = time.perf_counter()
            for ddl in indexes:
                pg.execute(ddl)
            pg.execute("SELECT setval(pg_get_serial_sequence('messages', 'id'), "
                       "GREATEST((SELECT COALESCE(max(id), 0) FROM messages), 1))")
            pg.commit()
            progress(f"  postgresql: rebuilt {len(indexes)} message indexes ({time.perf_counter() - t:.1f}s)")
        with psycopg.connect(conninfo(url), autocommit=True) as pg:
            pg.execute("VACUUM ANALYZE")
    finally:
        src.close()
    t = time.perf_counter()
    db = SessionDB(url)
    try:
        stats["index_search_rows"] = db.index_search()
    finally:
        db.close()
    progress(f"  postgresql: SessionDB.index_search() ({time.perf_counter() - t:.1f}s)")
    with psycopg.connect(conninfo(url), autocommit=True) as pg:
        pg.execute("VACUUM ANALYZE")
        stats["bytes"] = pg.execute("SELECT pg_database_size(current_database())").fetchone()[0]
    stats["seconds"] = round(time.perf_counter() - t0, 1)
    return stats


def new_name(label: str, kind: str = "") -> str:
    return f"hb_{label.lower()}{'_' + kind if kind else ''}_{uuid.uuid4().hex[:8]}"


def main(argv: list[str] | None = None) -> int:
    import generate

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sizes", nargs="*", default=["10k"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--url", default=default_url(), help="server URL (default $HERMES_STORE_TEST_PG_URL)")
    ap.add_argument("--drop", nargs="+", help="drop these databases instead")
    args = ap.parse_args(argv)
    if not args.url:
        raise SystemExit("no server: pass --url or set HERMES_STORE_TEST_PG_URL")
    if args.drop:
        for name in args.drop:
            drop_database(args.url, name)
        return 0
    for s in args.sizes:
        n = generate.parse_size(s)
        path, _meta = generate.ensure_db(n, args.seed)
        name = new_name(generate.label(n))
        url = create_database(args.url, name)
        stats = load(path, url)
        print(f"{name}: {stats}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
