"""Every package of hermes_store is listed in pyproject.toml, or the wheel would miss it."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_every_package_is_shipped() -> None:
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(REPO).parts)
        for init in (REPO / "hermes_store").rglob("__init__.py")
        if "_alembic" not in init.parts and "__pycache__" not in init.parts
    }
    assert found, "no packages found"
    assert found - listed == set()
