"""A 0-byte file is a new, empty database everywhere; an unmigrated one gets a typed error."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes_store import SessionDB, UnitOfWork, adopt, errors, migrations
from hermes_store.engine import create_engine


def test_unit_of_work_on_a_fresh_folder_names_the_fix_and_leaves_nothing_refused(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    engine = create_engine(db)
    with pytest.raises(errors.NotMigratedError, match=r"migrations\.upgrade"):
        with UnitOfWork(engine) as uow:
            uow.sessions.create("s1", "cli")
    engine.dispose()
    # Whatever SQLite left behind, a later upgrade takes it as a new database.
    assert migrations.upgrade(db) == migrations.head()
    with SessionDB(db) as sdb:
        sdb.create_session("s1", "cli")
        assert sdb.get_session("s1")["source"] == "cli"


@pytest.mark.parametrize("opener", ["upgrade", "sessiondb", "adopt"])
def test_zero_byte_file_is_a_new_database(tmp_path: Path, opener: str) -> None:
    db = tmp_path / "state.db"
    db.touch()
    if opener == "upgrade":
        assert migrations.upgrade(db) == migrations.head()
    elif opener == "sessiondb":
        SessionDB(db).close()
    else:
        adopt.adopt(db)
    assert migrations.current(db) == migrations.head()
    assert db.stat().st_size > 0


@pytest.mark.parametrize("command", [["upgrade"], ["adopt"], ["sessions"], ["current"]])
def test_zero_byte_file_through_the_cli(tmp_path: Path, command: list[str]) -> None:
    """Commands that create make a 0-byte file a store; read-only ones leave it 0 bytes."""
    from click.testing import CliRunner

    from hermes_store.cli import cli

    db = tmp_path / "state.db"
    db.touch()
    out = CliRunner().invoke(cli, ["--db", str(db), "--json", *command])
    if command in (["sessions"], ["current"]):  # read-only: says how to create one (exit 1), creates nothing
        assert out.exit_code == 1, out.output
        assert db.stat().st_size == 0
        return
    assert out.exit_code == 0, out.output
    assert migrations.current(db) == migrations.head()
