"""bench/peers.py runs without the peer packages (CI's test env has none of them):
``--help`` names every system, and ``--smoke`` drives our SessionDB, AsyncSessionDB
and the sqlite3 floor through all five operations with the row check. No figure is
asserted, only that the run completes and its correctness check holds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PEERS = Path(__file__).resolve().parent.parent / "bench" / "peers.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(PEERS), *args], capture_output=True, text=True, timeout=300)


def test_help_names_every_system_and_operation() -> None:
    out = _run("--help")
    assert out.returncode == 0, out.stderr
    for name in ("ours", "aio", "sqlitesession", "sqlalchemysession", "langchain", "floor", "writers", "search"):
        assert name in out.stdout


def test_smoke_run_of_our_side_checks_every_writer_row() -> None:
    out = _run("--smoke")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "sqlitesession" not in out.stdout.split("== sqlite ==")[1].split("\n\n")[0]
    row = next(line for line in out.stdout.splitlines() if "rows exact" in line)
    assert row.count("yes / 0 of 40") == 3, row
    for op in ("one append", "read a 10-msg conversation", "search a word", "list sessions", "8 writers x 5: aggregate"):
        line = next(line for line in out.stdout.splitlines() if op in line)
        assert " - " not in f" {line} ", line
