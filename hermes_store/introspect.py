"""Normalized schema snapshots of a SQLite file.

The shape matches ``shared/reference/schema/hermes_vNN.json``: per table each
column's declared type, NOT NULL, default and primary-key position, the foreign keys,
and whitespace/case/quote-folded SQL of every index, trigger, view and FTS5 virtual
table. Used by the tests (models == DDL == Hermes) and by adoption, which must tell
which Hermes shape a file really has.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

FTS_SHADOW_SUFFIXES = ("data", "idx", "content", "docsize", "config")


def normalize_sql(sql: str | None) -> str:
    """Fold comments, whitespace, quotes and case so equal DDL compares equal."""
    s = re.sub(r"--[^\n]*", " ", sql or "")
    s = re.sub(r"\s+", " ", s).strip()
    s = re.sub(r"\s*(\|\||[(),;=<>])\s*", r"\1", s)
    s = re.sub(r"(?i)\bif not exists\b ?", "", s)
    s = s.replace('"', "").replace("`", "")
    s = re.sub(r"='([A-Za-z_0-9]+)'", r"=\1", s)
    return s.lower().rstrip(";")


def _column_spec(typ: str, notnull: int, default: Any, pk: int) -> str:
    spec = typ.upper()
    if notnull:
        spec += " NOT NULL"
    if default is not None:
        spec += f" DEFAULT {str(default).strip('()')}"
    if pk:
        spec += f" PK{pk}"
    return spec


def snapshot(conn: sqlite3.Connection) -> dict[str, Any]:
    """Normalized schema of the database behind a DB-API sqlite3 connection."""
    rows = conn.execute("SELECT type, name, sql FROM sqlite_master").fetchall()
    virtual = {
        name: normalize_sql(sql)
        for type_, name, sql in rows
        if type_ == "table" and sql and sql.lstrip().upper().startswith("CREATE VIRTUAL")
    }
    shadows = {f"{v}_{suffix}" for v in virtual for suffix in FTS_SHADOW_SUFFIXES}
    out: dict[str, Any] = {"tables": {}, "indexes": {}, "triggers": {}, "views": {}, "virtual": virtual}
    for type_, name, sql in rows:
        if name.startswith("sqlite_") or name in shadows or name in virtual:
            continue
        if type_ == "table":
            cols = {
                r[1]: _column_spec(r[2], r[3], r[4], r[5])
                for r in conn.execute(f'PRAGMA table_xinfo("{name}")')
            }
            if set(cols) == {"version_num"}:  # an Alembic version table
                continue
            fks = sorted(
                f"{r[3]}->{r[2]}.{r[4]}" + (f" ON DELETE {r[6]}" if r[6] and r[6] != "NO ACTION" else "")
                for r in conn.execute(f'PRAGMA foreign_key_list("{name}")')
            )
            out["tables"][name] = {
                "columns": cols,
                "order": list(cols),
                "fks": fks,
                "autoincrement": "AUTOINCREMENT" in (sql or "").upper(),
            }
        elif type_ == "index" and sql:
            out["indexes"][name] = normalize_sql(sql)
        elif type_ == "trigger":
            out["triggers"][name] = normalize_sql(sql)
        elif type_ == "view":
            out["views"][name] = normalize_sql(sql)
    try:
        out["schema_version"] = conn.execute("SELECT version FROM schema_version").fetchone()[0]
    except (sqlite3.Error, TypeError):
        out["schema_version"] = None
    return out


def diff(reference: dict[str, Any], live: dict[str, Any]) -> list[str]:
    """Human-readable differences between two snapshots (empty when identical)."""
    problems: list[str] = []
    if reference.get("schema_version") != live.get("schema_version"):
        problems.append(
            f"schema_version: want {reference.get('schema_version')} got {live.get('schema_version')}"
        )
    for table, spec in reference["tables"].items():
        got = live["tables"].get(table)
        if got is None:
            problems.append(f"missing table {table}")
            continue
        for col, want in spec["columns"].items():
            have = got["columns"].get(col)
            if have != want:
                problems.append(f"{table}.{col}: want {want!r} got {have!r}")
        problems += [f"{table}: extra column {c}" for c in got["columns"] if c not in spec["columns"]]
        if sorted(spec["fks"]) != sorted(got["fks"]):
            problems.append(f"{table}: fks want {spec['fks']} got {got['fks']}")
        if spec.get("autoincrement", False) != got.get("autoincrement", False):
            problems.append(f"{table}: AUTOINCREMENT want {spec.get('autoincrement')} got {got.get('autoincrement')}")
    problems += [f"extra table {t}" for t in live["tables"] if t not in reference["tables"]]
    for kind in ("indexes", "triggers", "views", "virtual"):
        for name, sql in reference[kind].items():
            have = live[kind].get(name)
            if have != sql:
                problems.append(f"{kind} {name}:\n   want {sql}\n   got  {have}")
        problems += [f"extra {kind} {n}" for n in live[kind] if n not in reference[kind]]
    return problems
