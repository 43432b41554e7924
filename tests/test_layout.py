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
    for line in code_lines:
        code = line.split("#", 1)[0]
        if re.search(r"(?<![\w.])text\(|exec_driver_sql", code):
            found.append(f"code: {line.strip()[:60]}")
    return found


def _modules_without_sql() -> list[Path]:
    return [*sorted((PACKAGE / "cli").glob("*.py")), *sorted((PACKAGE / "sessiondb").glob("*.py")),
            PACKAGE / "facade.py"]


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


# --------------------------------------------------------------------- layers (issue 31)
#
# Bottom to top; a module imports its own layer or a lower one, never a higher one. The
# Hermes compatibility layer sits above the whole core: only the top tier and the Hermes
# layer itself may import it, so the core stands alone without it. Every module of the
# package has a layer (the longest prefix below wins): a new module is placed here, and
# the tests say when an import goes up. CONTRIBUTING.md shows the same map.

HERMES = "hermes"
#: (layer, why it sits there, modules and subpackages relative to hermes_store; "" is the package itself).
LAYERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("base", "facts, keys and pure functions that need no connection: every layer may use them",
     ("errors", "keys", "codec", "titles", "skills", "review_turns", "tenant_schema", "targets", "held_files",
      "locks", "introspect", "models", "retry", "search", "write_queue", "encryption")),
    ("dialects", "what differs per database kind, built on the models and the pure search builders",
     ("dialects", "sqlite_journal")),
    ("engine", "opening a database: URLs, engines, the BEGIN hook, private database files",
     ("engine", "paths")),
    ("adopt", "recognising and swapping Hermes' files in place: migrations adopts a Hermes file first, "
              "so adoption sits just under it",
     ("adopt",)),
    ("schema and data", "our revisions and the repositories (each table family's SQL); neither needs the other",
     ("migrations", "alembic_support", "_alembic", "repositories")),
    ("work", "units of work, multi-step operations and background upkeep over the repositories, "
             "and their async twins",
     ("uow", "operations", "tenancy", "upkeep", "aio.engine", "aio.migrations", "aio.operations", "aio.queues",
      "aio.repositories", "aio.uow")),
    (HERMES, "Hermes' SessionDB API and module-level names, its config.yaml and Hermes-only behaviours "
             "(test isolation guard, repair, state-file tracking, v26 journal rules); names Hermes' tests "
             "patch are read at run time (patch_points) only here",
     ("facade", "hermes_state", "hermes_state_common", "hermes_state_portability", "hermes_state_provider",
      "hermes_state_schema", "hermes_state_search", "hermes_names", "hermes_config", "patch_points", "sessiondb",
      "state_modules", "isolation", "repair", "state_files", "journal")),
    ("top", "entry points a user starts from (package namespace, CLI, copy, async SessionDB): may import all",
     ("", "aio", "aio.sessiondb", "copying", "cli")),
)
_LAYER_NAMES = [name for name, _why, _members in LAYERS]
_HERMES_LEVEL = _LAYER_NAMES.index(HERMES)
#: The only places the rules of point 3 allow (issue 31: one of each).
LINEAGE_MODULES = ("hermes_store.repositories.lineage",)
RETRY_MODULES = ("hermes_store.retry",)
#: Where a SQLite-or-not test on the dialect is at home (point 2).
DIALECT_TEST_HOMES = ("hermes_store.dialects", "hermes_store.adopt")


def _relative(module: str) -> str:
    return module[len(PACKAGE.name) + 1:] if module != PACKAGE.name else ""


def layer_of(module: str) -> int | None:
    """Index in :data:`LAYERS` of ``module`` (dotted, from hermes_store); None when unplaced."""
    rel = _relative(module)
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for level, (_name, _why, members) in enumerate(LAYERS):
        for member in members:
            hit = rel == member or (member != "" and rel.startswith(member + "."))
            if hit and (best is None or len(member) > best[0]):
                best = (len(member), level)
    return None if best is None else best[1]


def _within(module: str, homes: tuple[str, ...]) -> bool:
    return any(module == home or module.startswith(home + ".") for home in homes)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports that point to a higher layer than their module's (rule b)."""
    found = []
    for source in sorted(graph):
        here = layer_of(source)
        for target in sorted(graph[source]):
            there = layer_of(target)
            if here is not None and there is not None and there > here:
                found.append(f"{_relative(source)} ({_LAYER_NAMES[here]}) -> {_relative(target)} "
                             f"({_LAYER_NAMES[there]})")
    return found


def core_to_hermes(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a core module (below the Hermes layer) into the Hermes layer (rule a)."""
    return [
        f"{_relative(source)} -> {_relative(target)}"
        for source in sorted(graph)
        for target in sorted(graph[source])
        if (layer_of(source) or 0) < _HERMES_LEVEL and layer_of(target) == _HERMES_LEVEL
    ]


def patch_point_users(graph: dict[str, set[str]]) -> list[str]:
    """Modules outside the Hermes layer that import ``patch_points`` (rule d): a name read off
    the facade at run time is an upward dependency no import shows."""
    target = f"{PACKAGE.name}.patch_points"
    return sorted(_relative(m) for m, imported in graph.items() if target in imported and layer_of(m) != _HERMES_LEVEL)


def _unit(module: str) -> str:
    """The package-level unit of a module: its top-level module or subpackage."""
    rel = _relative(module)
    return rel.split(".")[0] if rel else "__init__"


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Imports between units (top-level modules and subpackages), self-edges left out."""
    units: dict[str, set[str]] = {}
    for source, targets in graph.items():
        edges = units.setdefault(_unit(source), set())
        edges.update(_unit(t) for t in targets if _unit(t) != _unit(source))
    return units


def _sources() -> dict[str, str]:
    return {name: path.read_text(encoding="utf-8") for name, path in _package_modules().items()}


def test_every_module_has_a_layer() -> None:
    assert [m for m in sorted(_package_modules()) if layer_of(m) is None] == []


def test_no_core_module_imports_the_hermes_layer() -> None:
    assert core_to_hermes(_graph()) == []


def test_imports_point_to_the_same_or_a_lower_layer() -> None:
    assert upward_imports(_graph()) == []


def test_no_package_level_cycle() -> None:
    assert _cycles(package_graph(_graph())) == []


def test_patch_points_only_inside_the_hermes_layer() -> None:
    assert patch_point_users(_graph()) == []


def _planted_graph(module: str, source: str) -> dict[str, set[str]]:
    """The import graph with ``module`` given as ``source`` (never written into the package)."""
    modules = _package_modules()
    path = PACKAGE.joinpath(*_relative(module).split(".")).with_suffix(".py")
    graph = _graph()
    graph[module] = {t for t, _line, _inner in _imports(path, modules, source) if t in modules and t != module}
    return graph


def test_the_layer_checks_catch_a_planted_violation() -> None:
    """Each rule of point 1 fails on a module that breaks it, given as source text."""
    assert layer_of("hermes_store.aio.uow") == _LAYER_NAMES.index("work")
    assert layer_of("hermes_store.aio.sessiondb") == _LAYER_NAMES.index("top")
    assert layer_of("hermes_store") == _LAYER_NAMES.index("top")
    assert layer_of("hermes_store.nowhere") is None
    planted = _planted_graph("hermes_store.repositories.probe", "from ..facade import SessionDB\n")
    assert "repositories.probe -> facade" in core_to_hermes(planted)
    assert any(v.startswith("repositories.probe (schema and data) -> facade") for v in upward_imports(planted))
    planted = _planted_graph("hermes_store.dialects.probe", "from .. import uow\n")
    assert "dialects.probe (dialects) -> uow (work)" in upward_imports(planted)
    assert core_to_hermes(planted) == [e for e in core_to_hermes(_graph())]  # a core->core edge is not Hermes'
    planted = _planted_graph("hermes_store.cli.probe", "from ..facade import SessionDB\n")
    assert "cli.probe -> facade" not in core_to_hermes(planted)  # the top tier may use the Hermes layer
    planted = _planted_graph("hermes_store.sessiondb.probe", "from .. import cli\n")
    assert "sessiondb.probe (hermes) -> cli (top)" in upward_imports(planted)
    planted = _planted_graph("hermes_store.engine", "from .patch_points import facade_value\n")
    assert "engine" in patch_point_users(planted)
    assert "isolation" not in patch_point_users(planted)  # the Hermes layer's own use is fine
    units = package_graph({"hermes_store.a.x": {"hermes_store.b.y"}, "hermes_store.b.z": {"hermes_store.a.w"},
                           "hermes_store.a.w": {"hermes_store.a.x"}})
    assert _cycles(units) == [["a", "b"]]  # no module cycle, but the packages a and b import each other
    assert _cycles({"hermes_store.a.x": {"hermes_store.b.y"}, "hermes_store.b.z": {"hermes_store.a.w"}}) == []


# --------------------------------------------------------------------- point 2: SQLite-or-not stays in dialects/


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def dialect_tests_in(source: str) -> list[str]:
    """``x.is_file`` read as a flag (not ``path.is_file()``) and ``x.fts5 is (not) None``:
    the "is this SQLite" questions issue 31 keeps inside dialects/ and adopt/."""
    tree = ast.parse(source)
    parents = _parents(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "is_file":
            parent = parents.get(node)
            if not (isinstance(parent, ast.Call) and parent.func is node):
                found.append(f"line {node.lineno}: .is_file")
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "fts5" for s in sides) and any(map(_is_none, sides)):
                found.append(f"line {node.lineno}: .fts5 is None")
    return found


def test_no_sqlite_or_not_tests_outside_the_dialects_and_adoption() -> None:
    found = [
        f"{_relative(module)}: {hit}"
        for module, source in sorted(_sources().items())
        if not _within(module, DIALECT_TEST_HOMES)
        for hit in dialect_tests_in(source)
    ]
    assert found == []


def test_the_dialect_test_scan_sees_what_it_refuses() -> None:
    assert dialect_tests_in("if dialect.is_file:\n    pass\n") == ["line 1: .is_file"]
    assert dialect_tests_in("serial = for_url(url).is_file and x\n") == ["line 1: .is_file"]
    assert dialect_tests_in("ok = d.fts5 is not None\n") == ["line 1: .fts5 is None"]
    assert dialect_tests_in("if None is self.dialect.fts5:\n    pass\n") == ["line 1: .fts5 is None"]
    assert dialect_tests_in("if path.is_file():\n    entry.is_file(follow_symlinks=False)\n") == []
    assert dialect_tests_in("x = d.fts5.rebuild(conn)\ny = d.fts5 == other\n") == []
    assert _within("hermes_store.adopt.work", DIALECT_TEST_HOMES)
    assert not _within("hermes_store.adoption", DIALECT_TEST_HOMES)


# --------------------------------------------------------------------- point 3: one of each
#
# One lineage module holds every recursive CTE; one copy of each constant (keys.py holds
# the shared ones); one registry of repositories from which every unit of work is
# derived; one retry runner that sleeps with jitter between two tries.

_RECURSIVE_SQL = re.compile(r"\bWITH\s+RECURSIVE\b", re.IGNORECASE)


def recursive_ctes_in(source: str) -> list[str]:
    """``.cte(..., recursive=True)`` calls and ``WITH RECURSIVE`` in string literals."""
    tree = ast.parse(source)
    docstrings = _docstring_nodes(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and any(
            kw.arg == "recursive" and isinstance(kw.value, ast.Constant) and kw.value.value is True
            for kw in node.keywords
        ):
            found.append(f"line {node.lineno}: recursive=True")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.lineno not in docstrings \
                and _RECURSIVE_SQL.search(node.value):
            found.append(f"line {node.lineno}: WITH RECURSIVE")
    return found


def test_recursive_ctes_only_in_the_lineage_module() -> None:
    found = [
        f"{_relative(module)}: {hit}"
        for module, source in sorted(_sources().items())
        if module not in LINEAGE_MODULES
        for hit in recursive_ctes_in(source)
    ]
    assert found == []


def test_the_recursive_cte_scan_sees_what_it_refuses() -> None:
    assert recursive_ctes_in("tree = select(t.c.id).cte('tree', recursive=True)\n") == ["line 1: recursive=True"]
    assert recursive_ctes_in('sql = f"""with  recursive tree(id) AS ({x})"""\n') == ["line 1: WITH RECURSIVE"]
    assert recursive_ctes_in('"""A WITH RECURSIVE walk, in prose."""\n# WITH RECURSIVE\nc = q.cte("c")\n') == []


#: Equal values that are a coincidence, not one fact kept twice: value -> (the names that may
#: hold it, why they stay apart). A new holder of a reviewed value fails until reviewed too.
REVIEWED_COINCIDENCES: dict[str, tuple[tuple[str, ...], str]] = {
    "float:1.0": (("cli._common.LOCK_NOTICE_S", "operations.search_index.CATCH_UP_BUDGET_S"),
                  "when the CLI says it waits for a lock; how long one inline index catch-up may run"),
    "float:5.0": (("cli._common.PROGRESS_EVERY", "facade._COMPRESSION_BUSY_WAIT_S", "operations.fts.STEP_BUDGET_S",
                   "sessiondb.usage.TOKEN_DRAIN_S", "state_files._QUARANTINE_LOCK_S"),
                  "five seconds for five unrelated waits: progress lines, a busy compression, one FTS step, "
                  "draining token writes at close, the quarantine lock"),
    "float:10.0": (("adopt.swap.SEAL_WAIT_S", "sessiondb.private.RAW_BUSY_TIMEOUT_S"),
                   "adoption's wait for the seal lock; Hermes' busy timeout on its raw connection"),
    "float:30.0": (("sessiondb.usage.TOKEN_WRITER_IDLE_S", "upkeep.IDLE_EXIT_S"),
                   "two different threads' idle exits (token writer, index upkeep), tuned apart"),
    "int:1": (("copying.plan.MARKER_FORMAT", "hermes_names.FTS_STORAGE_VERSION", "repositories.lineage._UP",
               "repositories.telegram.SCHEMA_VERSION"),
              "first versions of unrelated formats (copy marker, Hermes' FTS storage, telegram table), a direction"),
    "int:3": (("adopt.COPY_ATTEMPTS", "copying.plan.WORK_SPACE_FACTOR",
               "repair._MAX_MALFORMED_BACKUPS", "repair._MAX_PERSISTENT_REPAIR_ATTEMPTS",
               "repositories.fts_upkeep.HEAD_FTS_LAYOUT", "search.query.TRIGRAM_CHARS"),
              "attempts, a space factor, backups kept, Hermes' repair tries, an FTS "
              "layout number, a trigram"),
    "int:4": (("aio.engine.YIELD_EVERY", "facade.MAX_IDLE_CONNECTIONS", "journal._EIO_READS",
               "state_modules.search._MERGES_PER_TABLE"),
              "writes on the loop between two turns of it, idle connections kept, Hermes' disk-I/O re-reads,"
              " FTS merges per table"),
    "int:5": (("dialects.pg_engine.PREPARE_THRESHOLD_ON", "dialects.sqlite._SQLITE_BUSY"),
              "psycopg's prepare threshold; SQLite's SQLITE_BUSY result code"),
    "int:8": (("aio.sessiondb.SERVER_CALLS", "dialects.sqlite._SQLITE_READONLY", "facade._READ_POOL_MAX"),
              "async calls in flight to a server, SQLite's SQLITE_READONLY code, Hermes' read pool size"),
    "int:10": (("repositories.listing._FULL_AT", "search.fts.SNIPPET_TOKENS", "search.query.NEAR_DEFAULT"),
               "a listing threshold, tokens in a snippet, FTS5's default NEAR distance"),
    "int:40": (("repositories.search.SNIPPET_RADIUS", "search.word_hits._REACH_BEFORE"),
               "characters shown around a hit; characters cut into words before a hit on PostgreSQL"),
    "int:20": (("cli.maintain.DRY_RUN_SHOWN", "repositories.health.MAX_INTEGRITY_LINES"),
               "rows a dry run shows; integrity-check lines kept"),
    "int:50": (("copying.plan.LISTED", "facade.CHECKPOINT_EVERY", "repositories.listing._SCAN_ROWS",
                "search.query.NEAR_MAX"),
               "names listed, writes between checkpoints, rows per listing scan, the largest NEAR distance"),
    "int:60": (("facade._READ_OPEN_RETRY_SECONDS", "skills.PREVIEW_CHARS"),
               "Hermes' read-open retry seconds; characters of a skill preview"),
    "int:64": (("dialects.sqlite.BULK_STAGE_MIN", "repositories.display._SCAN_BATCH", "search.cjk_pairs.BLOCK"),
               "rows before a bulk stage pays, a display scan batch, a CJK pair block"),
    "int:100": (("facade.BUSY_TIMEOUT_MS", "titles.MAX_TITLE_LENGTH"),
                "SQLite's busy wait before our retry; Hermes' title length"),
    "int:120": (("repair._REPAIR_LOCK_TIMEOUT_SECONDS", "repositories.sessions.ACTIVITY_DESCRIPTION_CHARS"),
                "Hermes' repair lock timeout; characters of an activity description"),
    "int:200": (("operations.imports.IMPORT_BATCH", "repositories.search.CONTEXT_CHARS"),
                "sessions per import batch; characters of search context"),
    "int:500": (("operations.fts.REBUILD_CHUNK_ROWS", "repositories.base.ID_CHUNK", "search.fts.MERGE_PAGES",
                 "state_modules.schema._TRASH_STEP_ROWS"),
                "rows per rebuild transaction, ids per IN list, FTS5 merge pages, Hermes' trash step"),
    "int:1000": (("copying.plan.DEFAULT_BATCH", "engine.DEFAULT_BUSY_TIMEOUT_MS",
                  "repositories.fts_upkeep.BOUNDARY_SWEEP_IDS"),
                 "rows per copy batch, the engine's busy timeout, ids per FTS boundary sweep"),
    "int:2048": (("keys.MAX_FTS5_QUERY_CHARS", "repositories.base._MAX_RENDERED"),
                 "the longest FTS5 query Hermes takes; statements kept in the rendered-SQL cache"),
    "int:20000": (("copying.plan.INDEX_CHUNK", "errors.MAX_SAFE_EXPORT_MESSAGES", "errors.MAX_SAFE_RESUME_MESSAGES",
                   "operations.search_index.CATCH_UP_ROWS"),
                  "rows per copy index chunk; Hermes' export and resume caps; rows one index catch-up call takes"),
}
#: Alembic revisions are frozen history: they copy the values of their day on purpose.
_CONSTANT_SCAN_SKIPS = ("hermes_store._alembic",)
_CONSTANT_NAME = re.compile(r"^_*[A-Z][A-Z0-9_]*$")
_FOLD = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
         ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Pow: lambda a, b: a ** b}


def _literal(node: ast.AST) -> object:
    """The value of a literal (arithmetic on numbers folded: ``24 * 60 * 60``); raises ValueError otherwise."""
    if isinstance(node, ast.BinOp) and type(node.op) in _FOLD:
        left, right = _literal(node.left), _literal(node.right)
        if isinstance(left, (int, float)) and isinstance(right, (int, float)):
            return _FOLD[type(node.op)](left, right)
        raise ValueError("not arithmetic on numbers")
    return ast.literal_eval(node)


def constants_in(source: str) -> dict[str, object]:
    """Module-level UPPER_CASE names bound to a literal value, and that value. An empty
    container is a module's own state (a cache, a registry filled later), not a value."""
    found: dict[str, object] = {}
    for stmt in ast.parse(source).body:
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        else:
            continue
        try:
            literal = _literal(value)
        except (ValueError, TypeError, SyntaxError, ZeroDivisionError):
            continue
        if isinstance(literal, (dict, list, set, tuple)) and not literal:
            continue
        for target in targets:
            if isinstance(target, ast.Name) and _CONSTANT_NAME.match(target.id):
                found[target.id] = literal
    return found


def _holders(sources: dict[str, str]) -> dict[str, list[str]]:
    """Value (``type:repr``) -> qualified names holding it, modules of revisions left out."""
    holders: dict[str, list[str]] = {}
    for module, source in sources.items():
        if _within(module, _CONSTANT_SCAN_SKIPS):
            continue
        for name, value in constants_in(source).items():
            holders.setdefault(f"{type(value).__name__}:{value!r}", []).append(f"{_relative(module)}.{name}")
    return holders


def duplicate_constants(sources: dict[str, str], reviewed: dict[str, tuple[tuple[str, ...], str]]) -> list[str]:
    """Literal values bound to UPPER_CASE names in two or more modules, reviewed ones left out."""
    found = []
    for value, names in sorted(_holders(sources).items()):
        if len({name.rsplit(".", 1)[0] for name in names}) < 2:
            continue
        if value in reviewed and set(names) <= set(reviewed[value][0]):
            continue
        found.append(f"{value} in {', '.join(sorted(names))}")
    return found


def test_each_constant_is_kept_once() -> None:
    assert duplicate_constants(_sources(), REVIEWED_COINCIDENCES) == []


def test_every_reviewed_coincidence_still_exists_and_says_why() -> None:
    """A reviewed entry that matches nothing any more would excuse a future duplicate: drop it."""
    holders = _holders(_sources())
    stale = [
        value for value, (names, why) in REVIEWED_COINCIDENCES.items()
        if not why.strip() or len({n.rsplit(".", 1)[0] for n in set(names) & set(holders.get(value, ()))}) < 2
    ]
    assert stale == []


def test_the_constant_scan_sees_what_it_refuses() -> None:
    sources = {
        "hermes_store.a": 'DAY = 24 * 60 * 60\nVERSION_TABLE: str = "hermes_store_version"\nx = 86400\n_CACHE = {}\n',
        "hermes_store.b": 'SECONDS_PER_DAY = 86400\n_VERSION_TABLE = "hermes_store_version"\nDAY = keys.DAY\n'
                          "_SEEN = {}\n",
        "hermes_store.c": "def f():\n    DAY = 86400\n",
        "hermes_store._alembic.versions.r1": "DAY = 86400\n",
    }
    assert constants_in(sources["hermes_store.a"]) == {"DAY": 86400, "VERSION_TABLE": "hermes_store_version"}
    found = duplicate_constants(sources, {})
    assert found == ["int:86400 in a.DAY, b.SECONDS_PER_DAY",
                     "str:'hermes_store_version' in a.VERSION_TABLE, b._VERSION_TABLE"]
    reviewed = {"int:86400": (("a.DAY", "b.SECONDS_PER_DAY"), "planted")}
    assert duplicate_constants(sources, reviewed) == found[1:]
    sources["hermes_store.d"] = "ONE_DAY = 86400\n"  # a new holder of a reviewed value is not excused
    assert duplicate_constants(sources, reviewed)[0] == "int:86400 in a.DAY, b.SECONDS_PER_DAY, d.ONE_DAY"
    assert duplicate_constants({"hermes_store.a": "A = 1\nB = 1\n"}, {}) == []  # one module: its own business


def _repository_ref(node: ast.AST) -> bool:
    """A name of a repository class: ``SessionRepository``, ``repos.SessionRepository``, ``"SessionRepository"``."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id.endswith("Repository") and sub.id != "Repository":
            return True
        if isinstance(sub, ast.Attribute) and sub.attr.endswith("Repository") and sub.attr != "Repository":
            return True
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and re.fullmatch(r"\w+Repository", sub.value) \
                and sub.value != "Repository":
            return True
    return False


def _binds_repository(value: ast.AST) -> bool:
    """``SessionRepository`` or ``SessionRepository(conn)`` (a display of several is counted by its items)."""
    return _repository_ref(value.func if isinstance(value, ast.Call) else value) \
        if isinstance(value, (ast.Call, ast.Name, ast.Attribute, ast.Constant)) else False


def _pairings(node: ast.AST) -> int:
    """How many (attribute name, repository class) pairs one statement or display spells out."""
    if isinstance(node, ast.AnnAssign):
        return int(_repository_ref(node.annotation) or (node.value is not None and _binds_repository(node.value)))
    if isinstance(node, ast.Assign):
        return int(_binds_repository(node.value)) * len(node.targets)
    if isinstance(node, ast.Dict):
        return sum(1 for key, value in zip(node.keys, node.values, strict=True)
                   if key is not None and _repository_ref(value))
    if isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) == 2 and isinstance(node.elts[0], ast.Constant) \
            and isinstance(node.elts[0].value, str) and _repository_ref(node.elts[1]):
        return 1
    if isinstance(node, ast.Call):
        return sum(1 for kw in node.keywords if kw.arg is not None and _repository_ref(kw.value))
    return 0


def repository_lists_in(source: str) -> list[str]:
    """Scopes (module, class, function) that name three or more repositories each under an
    attribute name: every such scope is a list of the repositories."""
    tree = ast.parse(source)
    found = []

    def scan(scope: ast.AST, label: str) -> None:
        count = 0
        todo = list(ast.iter_child_nodes(scope))
        while todo:
            node = todo.pop()
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                scan(node, node.name)
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                    for t in node.targets):
                continue
            count += _pairings(node)
            if not isinstance(node, ast.AnnAssign):
                todo.extend(ast.iter_child_nodes(node))
        if count >= 3:
            found.append(f"line {getattr(scope, 'lineno', 1)}: {label} ({count} repositories)")

    scan(tree, "<module>")
    return found


#: Modules written by scripts/generate_aio_surface.py from the registry: they spell the
#: pairs out so a type checker sees them, and its --check (tests/test_aio_surface.py)
#: fails when they drift, so they are no second hand-kept list.
GENERATED = ("hermes_store.aio.repositories",)


def test_the_repositories_are_listed_once() -> None:
    """UnitOfWork, AsyncUnitOfWork and the aio classes take their repositories from one registry."""
    found = [
        f"{_relative(module)}: {hit}"
        for module, source in sorted(_sources().items()) if module not in GENERATED
        for hit in repository_lists_in(source)
    ]
    assert len(found) == 1, found


def test_the_repository_list_scan_sees_what_it_refuses() -> None:
    typed = "class UnitOfWork:\n    sessions: SessionRepository\n    messages: MessageRepository\n" \
            "    lineage: 'LineageRepository'\n"
    assert repository_lists_in(typed) == ["line 1: UnitOfWork (3 repositories)"]
    bound = "def enter(self, conn):\n    self.sessions = SessionRepository(conn)\n" \
            "    self.messages = repos.MessageRepository(conn)\n    self.usage = UsageRepository(conn)\n"
    assert repository_lists_in(bound) == ["line 1: enter (3 repositories)"]
    table = "REPOSITORIES = {'sessions': SessionRepository, 'messages': MessageRepository,\n" \
            "                'usage': UsageRepository}\n"
    assert repository_lists_in(table) == ["line 1: <module> (3 repositories)"]
    pairs = "REPOS = (('sessions', SessionRepository), ('messages', MessageRepository), ('usage', UsageRepository))\n"
    assert repository_lists_in(pairs) == ["line 1: <module> (3 repositories)"]
    derived = "from .repositories import SessionRepository, MessageRepository, UsageRepository\n" \
              "__all__ = ['SessionRepository', 'MessageRepository', 'UsageRepository']\n" \
              "class UnitOfWork:\n    def __enter__(self):\n        for name, cls in REGISTRY:\n" \
              "            setattr(self, name, cls(self.conn))\n    sessions: SessionRepository\n"
    assert repository_lists_in(derived) == []


def _call_name(call: ast.Call) -> str:
    """The last name of what is called: ``sleep`` for ``time.sleep(...)`` and ``sleep(...)``."""
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _calls_named(node: ast.AST, names: set[str]) -> list[ast.Call]:
    """Calls in ``node`` (nested functions left out) of a function whose last name is in ``names``."""
    found = []
    todo = [node]
    while todo:
        here = todo.pop()
        if here is not node and isinstance(here, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(here, ast.Call) and _call_name(here) in names:
            found.append(here)
        todo.extend(ast.iter_child_nodes(here))
    return found


def _draws_jitter(call: ast.Call) -> bool:
    """``random.<anything>(...)`` or a bare ``uniform(...)``: a random draw, which only the
    runner makes (calling the runner's own ``jitter`` is using the one policy)."""
    func = call.func
    return (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "random") \
        or (isinstance(func, ast.Name) and func.id == "uniform")


def retry_loops_in(source: str) -> list[str]:
    """Random draws (``random.uniform``) and loops that catch an error and sleep before the
    next pass (a retry policy, which lives in the one runner), named by the function holding them."""
    found: list[str] = []

    def scan(scope: ast.AST, label: str) -> None:
        todo = list(ast.iter_child_nodes(scope))
        while todo:
            node = todo.pop(0)
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                scan(node, f"{label}.{node.name}" if label != "<module>" else node.name)
                continue
            if isinstance(node, ast.Call) and _draws_jitter(node):
                found.append(f"{label}: jitter")
            if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
                catches = any(isinstance(n, ast.Try) and n.handlers for n in ast.walk(node))
                if catches and _calls_named(node, {"sleep"}):
                    found.append(f"{label}: a loop that catches and sleeps")
            todo.extend(ast.iter_child_nodes(node))

    scan(ast.parse(source), "<module>")
    return found


#: Loops that wait and try again but are not a write's lock retry, with why they stay.
REVIEWED_WAITS: dict[str, str] = {
    "journal: _on_disk_journal_mode: a loop that catches and sleeps":
        "Hermes v26's own re-read of PRAGMA journal_mode after a disk I/O error (4 tries 50 ms apart, "
        "no lock, no jitter): Hermes' behaviour kept as Hermes wrote it",
    "sessiondb.leases: TurnLeasesMixin.acquire_session_turn_lease: a loop that catches and sleeps":
        "Hermes' API polls a turn lease at the caller's poll_interval_seconds until wait_seconds; each "
        "try is one write that already runs on the retry runner",
    "state_files: quarantine_zeroed_state_db: a loop that catches and sleeps":
        "polls an flock on the quarantine lock file (not the database) for at most 5 s, as Hermes does",
}


def _retry_hits() -> list[str]:
    return [
        f"{_relative(module)}: {hit}"
        for module, source in sorted(_sources().items())
        if module not in RETRY_MODULES
        for hit in retry_loops_in(source)
    ]


def test_every_reviewed_wait_still_exists() -> None:
    """A reviewed wait that is gone would excuse a future loop in its place: drop it."""
    assert sorted(set(REVIEWED_WAITS) - set(_retry_hits())) == []


def test_retry_with_jitter_only_in_the_retry_runner() -> None:
    found = [
        f"{_relative(module)}: {hit}"
        for module, source in sorted(_sources().items())
        if module not in RETRY_MODULES
        for hit in retry_loops_in(source)
        if f"{_relative(module)}: {hit}" not in REVIEWED_WAITS
    ]
    assert found == []


def test_the_retry_scan_sees_what_it_refuses() -> None:
    loop = "def write(run):\n    while True:\n        try:\n            return run()\n" \
           "        except OperationalError:\n            time.sleep(random.uniform(0.02, 0.15))\n"
    assert retry_loops_in(loop) == ["write: a loop that catches and sleeps", "write: jitter"]
    async_loop = "class Store:\n    async def open(self):\n        for attempt in range(3):\n            try:\n" \
                 "                await go()\n            except Busy:\n                pass\n" \
                 "            await asyncio.sleep(0.1)\n"
    assert retry_loops_in(async_loop) == ["Store.open: a loop that catches and sleeps"]
    assert retry_loops_in("from random import uniform\ndelay = uniform(0.01, 0.1)\n") == ["<module>: jitter"]
    assert retry_loops_in("def wait(self):\n    self._sleep(retry.jitter(waited, left))\n") == []
    assert retry_loops_in("for x in xs:\n    time.sleep(1)\ntry:\n    go()\nexcept E:\n    pass\n") == []
    assert retry_loops_in("def f(d):\n    return retry.run(attempt, triage=retry.locks(d))\n") == []
