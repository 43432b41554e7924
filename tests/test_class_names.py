"""One class per name in the package (issue 31 point 4).

Two classes sharing a name (``AsyncSessionDB`` was both Hermes' thread wrapper and the
native async store) make a traceback, a type error or a ``repr`` ambiguous, and send a
reader to the wrong module. A name may be bound twice in one module (a typing stand-in
under ``if TYPE_CHECKING:`` / ``else:``); across modules it may not. An alias
(``Name = Other``, ``import Other as Name``) is not a class definition and is allowed:
that is how the facade serves a class under Hermes' name. An async twin that declares
its same-named sync class (``sync_class``) is that class's awaited face, not a rival.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hermes_store"


def class_definitions(sources: dict[str, str]) -> dict[str, set[str]]:
    """``{class name: {modules defining it}}`` over ``{module: source}``, nested classes included."""
    found: dict[str, set[str]] = defaultdict(set)
    for module, source in sources.items():
        for node in ast.walk(ast.parse(source, filename=module)):
            if isinstance(node, ast.ClassDef) and not is_async_twin(node):
                found[node.name].add(module)
    return found


def is_async_twin(node: ast.ClassDef) -> bool:
    """A class declaring ``sync_class = <module>.<its own name>``: the awaited face of that
    very class (``aio.SessionRepository`` of ``repositories.SessionRepository``), generated
    from it and checked against it (tests/test_aio_surface.py), not a second class that
    merely shares a name."""
    for stmt in node.body:
        if isinstance(stmt, ast.Assign) and [getattr(t, "id", None) for t in stmt.targets] == ["sync_class"]:
            value = stmt.value
            return isinstance(value, ast.Attribute) and value.attr == node.name
    return False


def shared_names(sources: dict[str, str]) -> dict[str, list[str]]:
    """The class names defined in more than one module, each with its modules (sorted)."""
    return {name: sorted(mods) for name, mods in sorted(class_definitions(sources).items()) if len(mods) > 1}


def package_sources() -> dict[str, str]:
    """Every module of the package (``_alembic``, a link to ``alembic/``, defines no class)."""
    return {
        str(path.relative_to(PACKAGE.parent)): path.read_text(encoding="utf-8")
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_no_two_classes_in_the_package_share_a_name() -> None:
    sources = package_sources()
    assert len(sources) > 100, "the scan found too few modules to be looking at the package"
    assert shared_names(sources) == {}


def test_the_scan_finds_a_planted_duplicate() -> None:
    planted = {
        "pkg/a.py": "class AsyncSessionDB:\n    pass\n",
        "pkg/b.py": "def make():\n    class AsyncSessionDB:\n        pass\n    return AsyncSessionDB\n",
        "pkg/c.py": "class Other:\n    pass\n",
    }
    assert shared_names(planted) == {"AsyncSessionDB": ["pkg/a.py", "pkg/b.py"]}


def test_the_scan_allows_a_stand_in_and_an_alias() -> None:
    planted = {
        "pkg/host.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    class Host:\n        x: int\n"
            "else:\n    class Host:\n        pass\n"
        ),
        "pkg/wrapper.py": "class ThreadedSessionDB:\n    pass\n",
        "pkg/facade.py": (
            "from .wrapper import ThreadedSessionDB as AsyncSessionDB\n"
            "Legacy = AsyncSessionDB\n"
        ),
    }
    assert shared_names(planted) == {}
    assert class_definitions(planted)["Host"] == {"pkg/host.py"}


def test_an_async_twin_names_its_own_sync_class() -> None:
    """The twin exemption holds only for a class that declares the same-named sync class."""
    planted = {
        "pkg/repositories.py": "class SessionRepository:\n    pass\n",
        "pkg/aio.py": "class SessionRepository(Base):\n    sync_class = sync.SessionRepository\n",
        "pkg/other.py": "class SessionRepository(Base):\n    sync_class = sync.MessageRepository\n",
    }
    assert shared_names(planted) == {"SessionRepository": ["pkg/other.py", "pkg/repositories.py"]}
