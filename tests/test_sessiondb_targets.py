"""``SessionDB`` takes what SQLAlchemy users pass: a path, a URL string, a URL or an Engine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from hermes_store import SessionDB, errors, migrations
from hermes_store.engine import create_engine


def _roundtrip(db: SessionDB) -> None:
    db.create_session("s1", "cli")
    db.append_message("s1", "user", "hello target")
    assert [h["session_id"] for h in db.search_messages("target")] == ["s1"]


@pytest.mark.parametrize("form", ["path", "str", "url-string", "url-object", "url-kw", "relative-url"])
def test_paths_and_urls_open_the_same_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str) -> None:
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "app.db"
    arg = {
        "path": db,
        "str": str(db),
        "url-string": f"sqlite:///{db}",
        "url-object": make_url(f"sqlite:///{db}"),
        "url-kw": None,
        "relative-url": "sqlite:///app.db",
    }[form]
    sdb = SessionDB(url=f"sqlite:///{db}") if form == "url-kw" else SessionDB(arg)
    with sdb:
        _roundtrip(sdb)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("app.db")) == []
    assert migrations.current(db) == migrations.head()
    assert (db.stat().st_mode & 0o777) == 0o600


@pytest.mark.parametrize("positional", [True, False])
def test_an_engine_opens_its_database(tmp_path: Path, positional: bool) -> None:
    db = tmp_path / "engine.db"
    engine = create_engine(db)
    with (SessionDB(engine) if positional else SessionDB(engine=engine)) as sdb:
        _roundtrip(sdb)
    # The caller's engine still works after close: it is theirs to dispose.
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM messages").scalar() == 1
    engine.dispose()


@pytest.mark.parametrize("url", ["mysql+pymysql://u:p@localhost/db", "oracle://u:p@host/db", "mssql+pyodbc://h/db"])
def test_unsupported_dialect_is_one_clear_error_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(errors.UnsupportedDatabaseError, match="not supported"):
        SessionDB(url)
    assert list(tmp_path.iterdir()) == []


def test_path_and_url_together_are_refused(tmp_path: Path) -> None:
    with pytest.raises(errors.HermesStoreError):
        SessionDB(tmp_path / "a.db", url=f"sqlite:///{tmp_path / 'b.db'}")
    assert list(tmp_path.iterdir()) == []


def test_hermes_signature_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "home"))
    with SessionDB() as sdb:
        _roundtrip(sdb)
    assert (tmp_path / "home" / "state.db").is_file()
    with SessionDB(db_path=tmp_path / "kw.db") as sdb:
        _roundtrip(sdb)
    assert os.path.isfile(tmp_path / "kw.db")
