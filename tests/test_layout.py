"""Layout (issue 12, point 6): the CLI and the facade issue no SQL of their own, and what
differs per database kind is found through one registry of dialect modules."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest
from sqlalchemy import create_engine

import hermes_store
from hermes_store import errors
from hermes_store.dialects import Dialect, for_connection, for_dialect
from hermes_store.dialects import sqlite as sqlite_dialect

PACKAGE = Path(hermes_store.__file__).parent
#: What counts as SQL text in a module that must not hold any.
SQL_MARKERS = re.compile(r"exec_driver_sql|\btext\(|\bSELECT\s|\bPRAGMA\b|\bVACUUM\b|json_each|sqlite_master")


def _docstring_nodes(tree: ast.AST) -> set[int]:
    """Line numbers of docstring constants (module, class, function)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                lines.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    return lines


def sql_in_code(source: str) -> list[str]:
    """SQL markers in code and string literals, comments and docstrings left out."""
    docstrings = _docstring_nodes(ast.parse(source))
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            continue
        if tok.type == tokenize.STRING and tok.start[0] in docstrings:
            continue
        if SQL_MARKERS.search(tok.string):
            found.append(f"line {tok.start[0]}: {tok.string[:60]}")
    # text( is a call: a NAME token then '(' — scan the code without comments/docstrings too
    code_lines = [
        line for i, line in enumerate(source.splitlines(), 1)
        if i not in docstrings
    ]
    for i, line in enumerate(code_lines, 1):
        code = line.split("#", 1)[0]
        if re.search(r"(?<![\w.])text\(|exec_driver_sql", code):
            found.append(f"code: {line.strip()[:60]}")
    return found


def _modules_without_sql() -> list[Path]:
    return sorted((PACKAGE / "cli").glob("*.py")) + sorted((PACKAGE / "sessiondb").glob("*.py")) + [PACKAGE / "facade.py"]


@pytest.mark.parametrize("path", _modules_without_sql(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_cli_and_facade_hold_no_sql(path: Path) -> None:
    assert sql_in_code(path.read_text(encoding="utf-8")) == []


def test_the_scan_finds_sql_and_ignores_comments_and_docstrings() -> None:
    """The check above would pass on anything if the scanner were blind: prove it sees SQL."""
    clean = '"""SELECT in a docstring is prose."""\nx = 1  # PRAGMA in a comment\n'
    assert sql_in_code(clean) == []
    for bad in (
        'rows = conn.execute(text("UPDATE t SET a = 1"))\n',
        'conn.exec_driver_sql("x")\n',
        'q = "SELECT id FROM sessions"\n',
        'raw.execute("PRAGMA journal_mode=WAL")\n',
        'def f():\n    """Doc."""\n    run("VACUUM")\n',
    ):
        assert sql_in_code(bad), bad


def test_registry_returns_the_sqlite_module_for_a_sqlite_connection(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        with engine.connect() as conn:
            found = for_connection(conn)
            assert found is sqlite_dialect.DIALECT
            assert found.name == "sqlite"
            assert isinstance(found, Dialect)
        assert for_connection(engine) is sqlite_dialect.DIALECT
        assert for_dialect("sqlite") is sqlite_dialect.DIALECT
    finally:
        engine.dispose()


@pytest.mark.parametrize("name", ["oracle", "mssql", "", "SQLITE"])
def test_registry_refuses_an_unknown_dialect(name: str) -> None:
    with pytest.raises(errors.UnsupportedDatabaseError, match="not supported"):
        for_dialect(name)


def test_sqlite_dialect_upsert_and_retry_rules(tmp_path: Path) -> None:
    """The pieces the repositories now take from the dialect behave as they did inline."""
    import sqlite3

    from sqlalchemy.exc import OperationalError

    d = sqlite_dialect.DIALECT
    conn = sqlite3.connect(tmp_path / "u.db")
    conn.execute("CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT)")
    up = d.upsert_sql("kv", ["k", "v"], ["k"], "v = excluded.v")
    ignore = d.upsert_sql("kv", ["k", "v"], [], None)
    conn.execute(up, {"k": "a", "v": "1"})
    conn.execute(up, {"k": "a", "v": "2"})
    conn.execute(ignore, {"k": "a", "v": "3"})
    assert conn.execute("SELECT k, v FROM kv").fetchall() == [("a", "2")]
    conn.close()
    assert d.is_retryable(sqlite3.OperationalError("database is locked"))
    assert d.is_retryable(OperationalError("BEGIN", {}, sqlite3.OperationalError("database is busy")))
    assert not d.is_retryable(sqlite3.OperationalError("no such table: x"))
    assert not d.is_retryable(ValueError("database is locked"))
    assert d.begin_options(True) != d.begin_options(False)
