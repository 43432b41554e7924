"""The static checks, run as CI runs the suite: ruff over the tree and mypy over the package.

Both read their configuration from pyproject.toml (the rule set and its reasons, the
per-module strictness), and both run from this interpreter's environment
(``sys.executable -m ...``), the versions the test extra pins. A failure prints the
tool's own report, file:line per finding.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: What ruff checks: the package, the Alembic tree, the benchmarks and the tests.
RUFF_PATHS = ("hermes_store", "alembic", "bench", "tests")

pytestmark = pytest.mark.slow


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=900,
    )


def _report(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"


def test_ruff_finds_nothing() -> None:
    done = _run("ruff", "check", "--no-cache", *RUFF_PATHS)
    assert done.returncode == 0, _report(done)


def test_mypy_finds_nothing_in_the_package() -> None:
    # No path given: ``files`` in [tool.mypy] names the package (its Alembic tree included).
    # No cache: a stale one from an earlier tree must not hide or invent a finding.
    done = _run("mypy", "--config-file", str(ROOT / "pyproject.toml"), "--no-incremental")
    assert done.returncode == 0, _report(done)
    assert "Success: no issues found" in done.stdout, _report(done)
