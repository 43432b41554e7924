"""Encrypted SQLite stores against plain ones (issue 34, point 1): append, search, open.

    .venv/bin/python bench/encryption.py                 # 10k messages (generated and cached by generate.py)
    .venv/bin/python bench/encryption.py --size 200k --rounds 5

The same corpus twice, in the same run: the cached ``state.db`` (``bench/generate.py``)
is copied to a scratch file (SQLite's backup API), and that copy encrypted into a
second one by ``hermes-store encrypt``'s own code (:func:`hermes_store.adopt.recrypt.recrypt`,
a passphrase key). Each measurement alternates plain and encrypted, round after round
(so drift in the machine hits both alike), and keeps the median per operation:

* append: one ``append_message`` per call into an open store (ms per message);
* search: ``search_messages`` for word, trigram (3+ CJK characters), short CJK (2
  characters, the bigram route) and Latin-inside-CJK queries (ms per query, each the
  mean of its queries), the hit counts checked equal on both files;
* search after appends: the word queries right after a round of appends (the reader's
  page cache is stale then: an encrypted file's pages are decrypted again), for scale;
* open: ``SessionDB(path[, key])`` and ``close()`` of the existing store (ms).

Printed: the figures, and encrypted / plain as a ratio (the target for search: at most 1.5).
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from generate import ensure_db, parse_size  # noqa: E402 - bench scripts import their sibling

from hermes_store import SessionDB  # noqa: E402
from hermes_store.adopt.recrypt import recrypt  # noqa: E402
from hermes_store.encryption import StoreKey  # noqa: E402

PASSPHRASE = "bench passphrase"
#: route -> queries (words the generator writes; CJK runs of 2 and 3+ characters).
QUERIES = {
    "word": ["error", "deploy", "database", "python"],
    "trigram": ["数据库", "服务器", "テスト"],
    "short CJK": ["数据", "東京", "서버"],
    "Latin in CJK": ["API", "Docker"],
}


def _copy(source: Path, target: Path) -> None:
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    src.close()
    dst.close()


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="10k", help="corpus size (messages): 10k, 200k...")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per measurement")
    parser.add_argument("--appends", type=int, default=300, help="appends per round")
    args = parser.parse_args(argv)

    source, _meta = ensure_db(parse_size(args.size))
    folder = Path(tempfile.mkdtemp(prefix="hs-bench-enc-"))
    plain, secret = folder / "plain.db", folder / "secret.db"
    _copy(source, plain)
    _copy(source, secret)
    started = time.perf_counter()
    recrypt(secret, None, StoreKey(PASSPHRASE))
    print(f"corpus: {args.size} messages ({source.name}); encrypted copy made in "
          f"{time.perf_counter() - started:.2f}s; {args.rounds} rounds, plain and encrypted alternating")

    stores = {"plain": (plain, None), "encrypted": (secret, PASSPHRASE)}
    times: dict[str, dict[str, list[float]]] = {kind: {} for kind in stores}
    hits: dict[str, dict[str, int]] = {kind: {} for kind in stores}
    dbs = {kind: SessionDB(path, key=key) for kind, (path, key) in stores.items()}
    try:
        for kind, db in dbs.items():
            db.create_session("bench-enc", source="bench")
            for queries in QUERIES.values():  # warm-up, and the hit counts
                for q in queries:
                    hits[kind][q] = len(db.search_messages(q, limit=50))
        for r in range(args.rounds):
            order = list(dbs.items()) if r % 2 == 0 else list(reversed(dbs.items()))
            for kind, db in order:  # searches of a store nobody writes to meanwhile
                for route, queries in QUERIES.items():
                    times[kind].setdefault(f"search: {route}", []).append(
                        _timed(lambda db=db, qs=queries: [db.search_messages(q, limit=20) for q in qs]) / len(queries))
        for r in range(args.rounds):
            order = list(dbs.items()) if r % 2 == 0 else list(reversed(dbs.items()))
            for kind, db in order:
                per = times[kind]

                def appends(db: SessionDB = db, r: int = r) -> None:
                    for i in range(args.appends):
                        db.append_message("bench-enc", role="user", content=f"round {r} message {i} deploy 数据库")

                per.setdefault("append", []).append(_timed(appends) / args.appends)
                # The first search after those writes: every page the reader had cached is
                # read again, and on an encrypted file decrypted again.
                per.setdefault("search after appends", []).append(
                    _timed(lambda db=db: [db.search_messages(q, limit=20) for q in QUERIES["word"]])
                    / len(QUERIES["word"]))
    finally:
        for db in dbs.values():
            db.close()
    for r in range(args.rounds):
        for kind, (path, key) in (stores.items() if r % 2 == 0 else reversed(stores.items())):
            times[kind].setdefault("open", []).append(_timed(lambda p=path, k=key: SessionDB(p, key=k).close()))

    mismatched = {q: (hits["plain"][q], hits["encrypted"][q]) for q in hits["plain"]
                  if hits["plain"][q] != hits["encrypted"][q]}
    print(f"hits per query (plain = encrypted): {hits['plain']}" if not mismatched else f"HIT MISMATCH: {mismatched}")
    print(f"{'operation':<24}{'plain ms':>12}{'encrypted ms':>15}{'ratio':>8}")
    worst_search = 0.0
    for op in times["plain"]:
        a, b = _median_ms(times["plain"][op]), _median_ms(times["encrypted"][op])
        ratio = b / a if a else float("nan")
        if op.startswith("search:"):
            worst_search = max(worst_search, ratio)
        print(f"{op:<24}{a:>12.3f}{b:>15.3f}{ratio:>8.2f}")
    print(f"worst search ratio: {worst_search:.2f} (target: at most 1.5)")
    return 1 if mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
