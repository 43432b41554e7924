"""Adoption says which kept sessions the default session list will not show, so
"sessions 5" in the report and 1 row in ``hermes-store sessions`` do not look like loss."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hermes_store import SessionDB
from hermes_store.adopt import adopt

from ..helpers import HERMES_DBS


@pytest.mark.parametrize("version", ["11", "16", "23"])
def test_the_report_accounts_for_every_session_the_list_leaves_out(tmp_path: Path, version: str) -> None:
    path = tmp_path / "state.db"
    shutil.copy(HERMES_DBS / f"hermes_v{version}.db", path)
    report = adopt(path)
    total = report.row_counts["sessions"]
    with SessionDB(path) as db:
        listed = db.list_sessions_rich(limit=10_000)
        everything = db.list_sessions_rich(limit=10_000, include_children=True)
    assert len(everything) == total  # nothing lost: --all shows every session
    assert total - sum(report.hidden_sessions.values()) == len(listed)
    if report.hidden_sessions:
        note = report.notes[-1]
        assert f"{sum(report.hidden_sessions.values())} of {total} sessions" in note and "--all" in note
    else:
        assert not any("not in the default session list" in n for n in report.notes)


def test_v11_names_its_orphaned_sub_agents(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    shutil.copy(HERMES_DBS / "hermes_v11.db", path)
    report = adopt(path)
    assert report.hidden_sessions == {"orphaned sub-agent runs": 3, "continuations": 1}
    assert "sub-agent runs whose parent link was lost (tagged at v16): 3" in report.notes[-1]


def test_the_cli_says_what_the_list_will_not_show(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from hermes_store.cli import cli

    path = tmp_path / "state.db"
    shutil.copy(HERMES_DBS / "hermes_v11.db", path)
    shown = CliRunner().invoke(cli, ["--db", str(path), "--json", "adopt"])
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.stdout)
    assert doc["hidden_sessions"] == {"orphaned sub-agent runs": 3, "continuations": 1}
