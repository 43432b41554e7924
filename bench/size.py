"""Bytes per 100k messages: our store against Hermes v26's own schema, same corpus.

    .venv/bin/python bench/size.py --quick        # 10k messages, scaled to 100k (about 30 s)
    .venv/bin/python bench/size.py                # 100k messages (a few minutes the first time)
    .venv/bin/python bench/size.py --size 200k --batch 1000

Issue 34, point 4 (size). ``generate.py``'s seeded corpus (cached) is copied, rows
and all, into two fresh files built the same way:

* ``ours``: a store at head (``SessionDB(path)``), then ``SessionDB.index_search()``
  (the short-CJK bigram index, kept outside SQL triggers), as on a live file;
* ``hermes``: Hermes v26's own DDL, replayed statement by statement from the
  Hermes-written ``tests/data/hermes-dbs/hermes_v26.db`` (``sqlite_master`` in creation
  order; FTS5 makes its shadow tables itself), in WAL mode as Hermes runs it.

Rows go in in id order through the schemas' own FTS triggers, ``--batch`` messages per
transaction (100 by default: a live file commits often, and each commit leaves FTS5 a
segment to merge), the columns the two schemas share. Each file is then measured with
``hermes-store size``'s own figures (``HealthRepository.space``: ``dbstat``) three times:
as built, after ``VACUUM``, and after an FTS ``optimize`` and ``VACUUM``. Per 100k
messages: the file, the tables with their indexes, each search index, free pages, and
ours / Hermes. Results go to ``bench/out/size-results[-quick].json``.

Read "after VACUUM" for like against like: as built, our file has been opened by
``SessionDB`` and had its bigram index filled, which reuse the free pages FTS5's
segment merges left while copying; Hermes' file still has them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from generate import OUT, ensure_db, label, parse_size

from hermes_store import SessionDB
from hermes_store.copying.endpoints import readonly_engine
from hermes_store.repositories.health import HealthRepository

ROOT = Path(__file__).resolve().parent.parent
#: Hermes v26 as Hermes itself wrote it (PROVENANCE: commit 7339f5f160db).
HERMES_V26 = ROOT / "tests" / "data" / "hermes-dbs" / "hermes_v26.db"
#: Copied in this order (parents before children), the columns both schemas have.
TABLES = ("system_prompts", "sessions", "session_model_usage", "messages")
PER = 100_000
#: Rows of the search indexes in the printed table, in this order.
SEARCH = ("messages_fts", "messages_fts_trigram", "messages_cjk_bigram")


def hermes_ddl() -> list[str]:
    """Hermes v26's CREATE statements in creation order, without what SQLite makes by
    itself (autoindexes, ``sqlite_sequence``, FTS5 shadow tables)."""
    with closing(sqlite3.connect(f"file:{HERMES_V26}?mode=ro", uri=True)) as conn:
        rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid").fetchall()
    virtual = [n for n, sql in rows if sql.upper().startswith("CREATE VIRTUAL TABLE")]
    shadows = {f"{v}{s}" for v in virtual for s in ("_data", "_idx", "_content", "_docsize", "_config")}
    return [sql for name, sql in rows if name not in shadows and name != "sqlite_sequence"]


def build_hermes(path: Path) -> None:
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        for sql in hermes_ddl():
            conn.execute(sql)
        conn.execute("INSERT INTO schema_version (version) VALUES (26)")


def build_ours(path: Path) -> None:
    SessionDB(path).close()


def columns(conn: sqlite3.Connection, schema: str, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f'PRAGMA {schema}.table_info("{table}")')]


def copy_corpus(source: Path, path: Path, batch: int, progress: Callable[[str], None]) -> None:
    """The corpus's rows into ``path``, in id order, ``batch`` messages per transaction."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("ATTACH DATABASE ? AS src", (f"file:{source}?mode=ro",))
        for table in TABLES:
            shared = [c for c in columns(conn, "src", table) if c in set(columns(conn, "main", table))]
            names = ", ".join(f'"{c}"' for c in shared)
            if table != "messages":
                conn.execute("BEGIN")
                conn.execute(f'INSERT INTO main."{table}" ({names}) SELECT {names} FROM src."{table}" ORDER BY rowid')
                conn.execute("COMMIT")
                continue
            top = conn.execute("SELECT COALESCE(max(id), 0) FROM src.messages").fetchone()[0]
            for start in range(0, top, batch):
                conn.execute("BEGIN")
                conn.execute(f"INSERT INTO main.messages ({names}) SELECT {names} FROM src.messages "
                             "WHERE id > ? AND id <= ? ORDER BY id", (start, start + batch))
                conn.execute("COMMIT")
                if start // batch % max(1, 20_000 // batch) == 0:
                    progress(f"    {path.name}: {start:,} / {top:,} messages")
        conn.execute("DETACH DATABASE src")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def space(path: Path) -> dict[str, Any]:
    """``hermes-store size``'s figures for the file (read-only, dbstat)."""
    with readonly_engine(path) as engine, engine.connect() as conn:
        try:
            return HealthRepository(conn).space()
        finally:
            conn.rollback()


def summary(doc: dict[str, Any]) -> dict[str, int]:
    search = {i["name"]: i["bytes"] or 0 for i in doc["search_indexes"]}
    out = {"file": doc["total_bytes"], "tables_and_indexes": sum(t["bytes"] for t in doc["tables"]),
           "messages_table": next((t["table_bytes"] for t in doc["tables"] if t["name"] == "messages"), 0),
           "messages_indexes": next((t["index_bytes"] for t in doc["tables"] if t["name"] == "messages"), 0),
           "search_total": sum(search.values()), "free": doc["free_bytes"] or 0}
    out.update({name: search.get(name, 0) for name in SEARCH})
    return out


def vacuum(path: Path, optimize: bool) -> None:
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        if optimize:
            for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE sql LIKE 'CREATE VIRTUAL TABLE%fts5%'"
                                        ).fetchall():
                conn.execute(f'INSERT INTO "{name}"("{name}") VALUES (\'optimize\')')
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def mb(n: float) -> str:
    return f"{n / 1e6:8.2f} MB"


def print_state(title: str, ours: dict[str, int], hermes: dict[str, int], scale: float) -> None:
    print(f"\n{title} (per {PER:,} messages)")
    print(f"  {'':<22}{'ours':>12}{'Hermes v26':>14}{'ours/Hermes':>13}")
    rows = ["file", "tables_and_indexes", "messages_table", "messages_indexes", "search_total", *SEARCH, "free"]
    for key in rows:
        a, b = ours[key] * scale, hermes[key] * scale
        ratio = f"{a / b:11.2f}x" if b else f"{'—':>12}"
        print(f"  {key:<22}{mb(a):>12}{mb(b):>14} {ratio}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10k messages, figures scaled to 100k")
    ap.add_argument("--size", default=None, help="corpus size (default 100k; --quick: 10k)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", type=int, default=100, help="messages per transaction while copying (default 100)")
    ap.add_argument("--keep", action="store_true", help="keep the two built files in bench/out/")
    args = ap.parse_args(argv)
    n = parse_size(args.size or ("10k" if args.quick else "100k"))
    started = time.perf_counter()
    source, meta = ensure_db(n, args.seed)
    messages = int(meta["messages"])
    scale = PER / messages
    folder = OUT / f"size-{label(n)}-s{args.seed}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    files = {"ours": folder / "ours.db", "hermes": folder / "hermes_v26.db"}
    build_ours(files["ours"])
    build_hermes(files["hermes"])
    for name, path in files.items():
        print(f"copying {messages:,} messages into {name} ({args.batch} per transaction)")
        copy_corpus(source, path, args.batch, print)
    store = SessionDB(files["ours"])
    try:
        store.index_search()  # the short-CJK index, as a file SessionDB wrote all along has it
    finally:
        store.close()
    for path in files.values():
        with closing(sqlite3.connect(path, isolation_level=None)) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    states: dict[str, dict[str, dict[str, int]]] = {}
    for state, step in (("as built", None), ("after VACUUM", False), ("after fts optimize + VACUUM", True)):
        if step is not None:
            for path in files.values():
                vacuum(path, optimize=step)
        states[state] = {name: summary(space(path)) for name, path in files.items()}
        print_state(state, states[state]["ours"], states[state]["hermes"], scale)
    result = {"messages": messages, "seed": args.seed, "batch": args.batch, "scale_to": PER,
              "sqlite": sqlite3.sqlite_version, "corpus": source.name, "states": states,
              "seconds": round(time.perf_counter() - started, 1)}
    out = OUT / f"size-results{'-quick' if args.quick else ''}.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"\n{messages:,} messages (seed {args.seed}), scaled ×{scale:.2f}; SQLite {sqlite3.sqlite_version}; "
          f"{result['seconds']} s; results in {out.relative_to(ROOT)}")
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
