"""Layout (issue 12, point 6): the CLI and the facade issue no SQL of their own, and what
differs per database kind is found through one registry of dialect modules."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest
from sqlalchemy import Column, MetaData, String, Table, create_engine

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
    engine = create_engine(f"sqlite:///{tmp_path / 'u.db'}")
    kv = Table("kv", MetaData(), Column("k", String, primary_key=True), Column("v", String))
    with engine.begin() as conn:
        kv.create(conn)
        ins = d.insert(kv)
        up = ins.on_conflict_do_update(index_elements=[kv.c.k], set_={"v": ins.excluded.v})
        ignore = d.insert(kv).on_conflict_do_nothing()
        conn.execute(up, {"k": "a", "v": "1"})
        conn.execute(up, {"k": "a", "v": "2"})
        conn.execute(ignore, {"k": "a", "v": "3"})
        assert conn.execute(kv.select()).fetchall() == [("a", "2")]
    engine.dispose()
    assert d.is_retryable(sqlite3.OperationalError("database is locked"))
    assert d.is_retryable(OperationalError("BEGIN", {}, sqlite3.OperationalError("database is busy")))
    assert not d.is_retryable(sqlite3.OperationalError("no such table: x"))
    assert not d.is_retryable(ValueError("database is locked"))
    assert d.begin_options(True) != d.begin_options(False)


# --------------------------------------------------------------------- the import graph
#
# Rooms import one way. A cycle hidden by an import inside a function still is one, so
# such imports of the package are refused outright, and the graph (every import, at any
# depth) must have no cycle. What differs per database kind is asked of the dialect
# modules: nothing outside hermes_store/dialects/ looks at a dialect or driver name.

_NAME_CHECKS = re.compile(r"\bdialect\.name\b|get_backend_name\(\)|get_driver_name\(\)|\.driver\b")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path, modules: dict[str, Path], source: str | None = None) -> list[tuple[str, int, bool]]:
    """(imported module of ours, line, inside a function) for every import in ``path``
    (whose text is ``source`` when given)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: list[tuple[str, int, bool]] = []  # appended to by visit()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, in_function) for a in child.names
                             if a.name.split(".")[0] == PACKAGE.name)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                if target.split(".")[0] == PACKAGE.name:
                    subs = [f"{target}.{a.name}" for a in child.names if f"{target}.{a.name}" in modules]
                    for t in subs if len(subs) == len(child.names) else [target, *subs]:
                        found.append((t, child.lineno, in_function))
            visit(child, nested)

    visit(ast.parse(path.read_text(encoding="utf-8") if source is None else source), False)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _package_modules()
    return {
        name: {t for t, _line, _inner in _imports(path, modules) if t in modules and t != name}
        for name, path in modules.items()
    }


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def test_no_package_imports_inside_functions() -> None:
    modules = _package_modules()
    inner = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {target}"
        for path in modules.values()
        for target, line, in_function in _imports(path, modules)
        if in_function
    ]
    assert inner == []


def test_no_dialect_or_driver_checks_outside_the_dialects() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "dialects":
            continue
        source = path.read_text(encoding="utf-8")
        docstrings = _docstring_nodes(ast.parse(source))
        for i, line in enumerate(source.splitlines(), 1):
            if i not in docstrings and _NAME_CHECKS.search(line.split("#", 1)[0]):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{i}: {line.strip()}")
    assert found == []


def test_the_graph_checks_see_what_they_refuse() -> None:
    """The three checks above would pass on anything if they were blind."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    probe = PACKAGE / "dialects" / "_probe.py"  # never written: its text is given
    source = "from . import sqlite\ndef f():\n    from .. import errors\n    import hermes_store.engine\n"
    found = _imports(probe, _package_modules(), source)
    assert ("hermes_store.dialects.sqlite", 1, False) in found
    assert ("hermes_store.errors", 3, True) in found and ("hermes_store.engine", 4, True) in found
    assert _NAME_CHECKS.search('if conn.dialect.name == "sqlite":')
    assert _NAME_CHECKS.search("url.get_backend_name() != 'postgresql'")
    assert not _NAME_CHECKS.search("for_connection(conn).has_schemas")
