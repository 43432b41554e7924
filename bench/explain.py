"""``bench/run.py --backend postgresql --explain``: the library's SQL and its plans.

For each search route (word, 2-character CJK, CJK 3+), for lineage (ancestors and
compression tip) and for the listing page, one representative facade call is made
twice: a warm-up, then the call whose statements are recorded, with their parameters,
by a ``before_cursor_execute`` listener on the facade's engine. Every recorded
statement is then run again as ``EXPLAIN (ANALYZE, BUFFERS, FORMAT TEXT) <statement>``
with the same parameters, on a connection of the same engine (so the same session
setup), all of one call in one transaction that is rolled back at the end (a savepoint
around each statement, so one failure does not hide the rest). Statements EXPLAIN does
not take (``SET``, ``SAVEPOINT`` ...) are run as they are, so the transaction is in the
state the library's was. The plans go to ``bench/plans-postgresql.md``.
"""

from __future__ import annotations

import datetime
import re
import sqlite3
from pathlib import Path
from typing import Any
from collections.abc import Callable

HERE = Path(__file__).resolve().parent
PLANS = HERE / "plans-postgresql.md"

_EXPLAINABLE = re.compile(r"^\s*(\(|SELECT|WITH|INSERT|UPDATE|DELETE|VALUES|TABLE)\b", re.I)
_CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
_EXEC_TIME = re.compile(r"Execution Time: ([\d.]+) ms")


def cjk_share(sqlite_path: str | Path) -> tuple[int, int]:
    """(rows with a CJK character in content or tool_calls, all rows) of a generated file."""
    conn = sqlite3.connect(str(sqlite_path))
    try:
        n = k = 0
        for content, calls in conn.execute("SELECT content, tool_calls FROM messages"):
            n += 1
            if _CJK.search(f"{content or ''}{calls or ''}"):
                k += 1
        return k, n
    finally:
        conn.close()


class Recorder:
    """Records (statement, parameters, executemany) on an engine while active."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.statements: list[tuple[str, Any, bool]] = []

    def _before(self, _conn: Any, _cursor: Any, statement: str, parameters: Any, _ctx: Any, many: bool) -> None:
        self.statements.append((statement, parameters, many))

    def __enter__(self) -> Recorder:
        from sqlalchemy import event

        event.listen(self.engine, "before_cursor_execute", self._before)
        return self

    def __exit__(self, *exc: Any) -> None:
        from sqlalchemy import event

        event.remove(self.engine, "before_cursor_execute", self._before)


def _explain(engine: Any, statements: list[tuple[str, Any, bool]]) -> list[dict[str, Any]]:
    out = []
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        for i, (stmt, params, many) in enumerate(statements):
            entry: dict[str, Any] = {"statement": stmt, "parameters": params, "executemany": many}
            cur.execute(f"SAVEPOINT hb_explain_{i}")
            try:
                if many:
                    entry["note"] = "executemany: not explained"
                elif _EXPLAINABLE.match(stmt):
                    cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT TEXT) " + stmt, params)
                    entry["plan"] = "\n".join(r[0] for r in cur.fetchall())
                    m = _EXEC_TIME.search(entry["plan"])
                    entry["execution_ms"] = float(m.group(1)) if m else None
                else:
                    cur.execute(stmt, params)
                    entry["note"] = "not a statement EXPLAIN takes: run as it is"
                cur.execute(f"RELEASE SAVEPOINT hb_explain_{i}")
            except Exception as exc:
                entry["error"] = f"{type(exc).__name__}: {exc}".strip()
                cur.execute(f"ROLLBACK TO SAVEPOINT hb_explain_{i}")
            out.append(entry)
        cur.close()
    finally:
        try:
            raw.rollback()
        finally:
            raw.close()
    return out


def routes(env: Any, meta: dict[str, Any]) -> list[tuple[str, str, Callable[[], Any]]]:
    db = env.db
    tip, root = meta["deep_chain_tip"], meta["deep_chain_root"]
    return [
        ("word search", "search_messages('timeout')", lambda: db.search_messages("timeout")),
        ("CJK 2-char search", "search_messages('数据')", lambda: db.search_messages("数据")),
        ("CJK 3+-char search", "search_messages('数据库')", lambda: db.search_messages("数据库")),
        ("lineage: ancestors", f"get_session_lineage(<tip of the {meta['deep_chain_length']}-deep chain>)",
         lambda: db.get_session_lineage(tip)),
        ("lineage: compression tip", f"get_compression_tip(<root of the {meta['deep_chain_length']}-deep chain>)",
         lambda: db.get_compression_tip(root)),
        ("listing: page of 20", "list_sessions_rich(limit=20)", lambda: db.list_sessions_rich(limit=20)),
    ]


def _params(p: Any) -> str:
    text = repr(p)
    return text if len(text) <= 2000 else text[:2000] + f"... ({len(text):,} characters)"


def run(env: Any, meta: dict[str, Any], size: str, sqlite_path: str | Path, info: dict[str, Any],
        path: Path = PLANS) -> Path:
    """Record, explain and write the plans; returns the file written."""
    k, n = cjk_share(sqlite_path)
    results = []
    for route, call, fn in routes(env, meta):
        fn()  # warm-up: first-call work (column caches, catch-up) is not what a route costs
        with Recorder(env.engine) as rec:
            fn()
        plans = _explain(env.engine, rec.statements)
        results.append((route, call, plans))
        total = sum(p.get("execution_ms") or 0.0 for p in plans)
        print(f"    explain {route:<26} {len(plans)} statement(s), server execution {total:8.2f} ms")

    cjk_pct = f", {meta['cjk_sessions_pct']} % CJK sessions" if "cjk_sessions_pct" in meta else ""
    lines = [
        "# PostgreSQL plans of the library's statements",
        "",
        f"Written by `bench/run.py --backend postgresql --explain` on "
        f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}: PostgreSQL {info.get('postgresql', '?')}, "
        f"hermes_store {info.get('hermes_store', '?')} @ {info.get('commit', '?')}, SQLAlchemy "
        f"{info.get('sqlalchemy', '?')}, psycopg {info.get('psycopg', '?')}.",
        "",
        f"Corpus: {size} messages ({meta['messages']:,} messages, {meta['sessions']:,} sessions, seed "
        f"{meta.get('seed', '?')}{cjk_pct}), "
        f"{k:,} of {n:,} rows ({100 * k / max(n, 1):.1f} %) with CJK text in content or tool calls.",
        "",
        "Each route: one facade call after a warm-up call; its statements recorded with "
        "`before_cursor_execute` on the facade's engine, with their parameters, then each run as "
        "`EXPLAIN (ANALYZE, BUFFERS, FORMAT TEXT)` on a connection of the same engine, in one transaction "
        "that is rolled back. BEGIN/COMMIT are not statements SQLAlchemy executes, so they are not listed. "
        "Buffers are warm (the call ran twice before).",
        "",
        "| route | call | statements | server execution (sum) |",
        "|---|---|---:|---:|",
    ]
    for route, call, plans in results:
        total = sum(p.get("execution_ms") or 0.0 for p in plans)
        lines.append(f"| {route} | `{call}` | {len(plans)} | {total:.2f} ms |")
    for route, call, plans in results:
        lines += ["", f"## {route}: `{call}`", ""]
        for i, p in enumerate(plans, 1):
            lines += [f"### statement {i} of {len(plans)}"
                      + (f" ({p['execution_ms']:.2f} ms)" if p.get("execution_ms") is not None else ""), "",
                      "```sql", p["statement"].strip(), "```", "", f"parameters: `{_params(p['parameters'])}`", ""]
            if "plan" in p:
                lines += ["```text", p["plan"], "```", ""]
            if "note" in p:
                lines.append(f"*{p['note']}*")
            if "error" in p:
                lines.append(f"**EXPLAIN failed:** `{p['error']}`")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
