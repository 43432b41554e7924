"""Session ids never become paths: transcript files are only ever deleted inside the
sessions folder, whatever the id holds (issue 9: an imported ``../victim`` session made
``prune`` delete ``victim.json`` next to the folder)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from hermes_store import SessionDB, UnitOfWork
from hermes_store.repositories.maintenance import transcript_files, transcript_files_many

from .factories import set_times

DAY = 86400.0
OLD = 1_600_000_000.0  # far older than any retention window

#: Ids that must never reach outside the folder (or crash the file cleanup).
HOSTILE = [
    "../victim",
    "../../victim2",
    "a/b",
    "..",
    ".",
    "sub/../../victim3",
    "x\x00y",
    "v" * 400,
]


@pytest.fixture
def layout(tmp_path: Path) -> dict:
    """``root/sessions`` plus victim files outside it (and in a subfolder) that hostile ids aim at."""
    root = tmp_path / "root"
    folder = root / "sessions"
    (folder / "a").mkdir(parents=True)
    (folder / "sub").mkdir()
    abs_dir = tmp_path / "abs"
    abs_dir.mkdir()
    victims = [
        root / "victim.json", root / "victim.jsonl", root / "request_dump_.._victim_1.json",
        tmp_path / "victim2.json", root / "victim3.json",
        folder / "a" / "b.json", folder / "a" / "b.jsonl",  # inside, but not an entry of the folder
        abs_dir / "x.json", abs_dir / "x.jsonl",
        folder / "...json", folder / "..json",  # what ".." and "." would name: skipped, kept
    ]
    for i, v in enumerate(victims):
        v.write_text(f"victim {i}")
    return {"root": root, "folder": folder, "abs_id": str(abs_dir / "x"), "victims": victims}


def _snapshot(paths: list[Path]) -> dict[Path, str]:
    return {p: p.read_text() for p in paths}


def _legit(folder: Path, sid: str) -> list[Path]:
    files = [folder / f"{sid}.json", folder / f"{sid}.jsonl", folder / f"request_dump_{sid}_20240101_1.json"]
    for f in files:
        f.write_text("legit")
    return files


def _hostile_ids(layout: dict) -> list[str]:
    return [*HOSTILE, layout["abs_id"]]


def _make_sessions(db: SessionDB, ids: list[str], *, ended_old: bool = True) -> None:
    for sid in ids:
        db.create_session(sid, "cli")
        db.append_message(sid, "user", f"hello from {sid!r}")
        if ended_old:
            set_times(db, sid, started_at=OLD, ended_at=OLD + 60, end_reason="done", messages_at=OLD)


def test_delete_session_with_hostile_ids_keeps_outside_files(db: SessionDB, layout: dict, caplog) -> None:
    folder = layout["folder"]
    ids = _hostile_ids(layout)
    _make_sessions(db, [*ids, "good"], ended_old=False)
    before = _snapshot(layout["victims"])
    legit = _legit(folder, "good")
    caplog.set_level(logging.WARNING, logger="hermes_store.repositories.maintenance")
    for sid in ids:
        assert db.delete_session(sid, sessions_dir=folder) is True
        assert db.get_session(sid) is None  # the row goes even when its files are skipped
    assert _snapshot(layout["victims"]) == before
    assert all(p.exists() for p in legit)  # another session's files are not touched
    assert db.delete_session("good", sessions_dir=folder) is True
    assert not any(p.exists() for p in legit)
    skipped = [r for r in caplog.records if "left alone" in r.getMessage()]
    assert len(skipped) == len(ids)
    assert db.message_count() == 0


def test_prune_with_hostile_ids_keeps_outside_files(db: SessionDB, layout: dict) -> None:
    folder = layout["folder"]
    ids = _hostile_ids(layout)
    _make_sessions(db, [*ids, "old-good"])
    db.create_session("fresh", "cli")
    before = _snapshot(layout["victims"])
    legit = _legit(folder, "old-good")
    keep = _legit(folder, "fresh")
    assert db.prune_sessions(older_than_days=90, sessions_dir=folder) == len(ids) + 1
    assert _snapshot(layout["victims"]) == before
    assert not any(p.exists() for p in legit)
    assert all(p.exists() for p in keep)
    assert db.session_count() == 1


def test_auto_prune_and_ghost_prune_with_hostile_ids(db: SessionDB, layout: dict) -> None:
    folder = layout["folder"]
    ids = _hostile_ids(layout)
    # Ghosts: tui, untitled, ended, older than a day, no message.
    for sid in ids:
        db.create_session(sid, "tui")
        set_times(db, sid, started_at=OLD, ended_at=OLD + 1, end_reason="done", messages_at=OLD)
    before = _snapshot(layout["victims"])
    ghost_files = _legit(folder, "ghost")
    db.create_session("ghost", "tui")
    set_times(db, "ghost", started_at=OLD, ended_at=OLD + 1, end_reason="done", messages_at=OLD)
    assert db.prune_empty_ghost_sessions(sessions_dir=folder) == len(ids) + 1
    assert _snapshot(layout["victims"]) == before
    assert not any(p.exists() for p in ghost_files)

    _make_sessions(db, [*ids, "auto"])
    auto_files = _legit(folder, "auto")
    result = db.maybe_auto_prune_and_vacuum(retention_days=90, sessions_dir=folder)
    assert "error" not in result and result["pruned"] == len(ids) + 1
    assert _snapshot(layout["victims"]) == before
    assert not any(p.exists() for p in auto_files)


def test_jsonl_import_then_prune_keeps_outside_files(db: SessionDB, layout: dict, tmp_path: Path) -> None:
    """The reported attack: import a JSONL export holding ``../victim``, then prune."""
    folder = layout["folder"]
    ids = [*_hostile_ids(layout), "imported-good"]
    export = tmp_path / "export.jsonl"
    with export.open("w") as fh:
        for sid in ids:
            fh.write(json.dumps({
                "id": sid, "source": "cli", "started_at": OLD, "ended_at": OLD + 5, "end_reason": "done",
                "messages": [{"role": "user", "content": "imported", "timestamp": OLD}],
            }) + "\n")
    with UnitOfWork(db.engine) as uow:
        for line in export.read_text().splitlines():
            assert uow.maintenance.import_session(json.loads(line)) is True
    assert db.session_count() == len(ids)
    before = _snapshot(layout["victims"])
    legit = _legit(folder, "imported-good")
    with UnitOfWork(db.engine) as uow:
        assert uow.maintenance.prune_sessions(90, sessions_dir=folder) == len(ids)
    assert _snapshot(layout["victims"]) == before
    assert not any(p.exists() for p in legit)
    assert db.session_count() == 0 and db.message_count() == 0


@pytest.mark.parametrize(
    "sid, own, others",
    [
        ("a*", ["a*.json", "a*.jsonl", "request_dump_a*_1.json"], ["abc.json", "a.jsonl", "request_dump_ab_1.json"]),
        ("q?", ["q?.json", "request_dump_q?_7.json"], ["qx.json", "request_dump_qx_7.json"]),
        ("[ab]", ["[ab].json", "request_dump_[ab]_1.json"], ["a.json", "b.jsonl", "request_dump_a_1.json"]),
        ("r]", ["r].json"], ["r.json"]),
    ],
)
def test_glob_characters_are_plain_characters(db: SessionDB, tmp_path: Path, sid: str, own: list[str], others: list[str]) -> None:
    folder = tmp_path / "sessions"
    folder.mkdir()
    for name in own + others:
        (folder / name).write_text(name)
    db.create_session(sid, "cli")
    assert sorted(p.name for p in transcript_files(folder, sid)) == sorted(own)
    assert db.delete_session(sid, sessions_dir=folder) is True
    assert sorted(p.name for p in folder.iterdir()) == sorted(others)


def test_symlinked_transcript_is_unlinked_not_followed(db: SessionDB, tmp_path: Path) -> None:
    folder = tmp_path / "sessions"
    folder.mkdir()
    target = tmp_path / "precious.json"
    target.write_text("precious")
    (folder / "s.json").symlink_to(target)
    db.create_session("s", "cli")
    assert db.delete_session("s", sessions_dir=folder) is True
    assert not (folder / "s.json").is_symlink()
    assert target.read_text() == "precious"


def test_transcript_lookup_refuses_unsafe_ids_and_tolerates_missing_folder(layout: dict, tmp_path: Path, caplog) -> None:
    folder = layout["folder"]
    caplog.set_level(logging.WARNING, logger="hermes_store.repositories.maintenance")
    for sid in _hostile_ids(layout):
        assert transcript_files(folder, sid) == []
    assert len([r for r in caplog.records if "left alone" in r.getMessage()]) == len(_hostile_ids(layout))
    assert transcript_files(tmp_path / "no-such-folder", "s") == []
    legit = _legit(folder, "ok")
    many = transcript_files_many(folder, ["ok", "../victim", "missing"])
    assert sorted(many["ok"]) == sorted(legit)
    assert many["../victim"] == [] and many["missing"] == []
    assert all(p.parent == folder for p in many["ok"])


def test_request_dumps_of_an_id_with_underscores(db: SessionDB, tmp_path: Path) -> None:
    """Ids holding ``_`` still find their dumps (the id is matched up to an underscore)."""
    folder = tmp_path / "sessions"
    folder.mkdir()
    sid = "20240101_120000_abc"
    names = [f"request_dump_{sid}_20240101_120001.json", f"{sid}.jsonl"]
    for n in [*names, "request_dump_20240101_1.json", "20240101_120000.json"]:
        (folder / n).write_text("x")
    db.create_session(sid, "cli")
    assert sorted(p.name for p in transcript_files(folder, sid)) == sorted(names)
    db.delete_session(sid, sessions_dir=folder)
    assert sorted(os.listdir(folder)) == ["20240101_120000.json", "request_dump_20240101_1.json"]


def test_request_dump_of_a_longer_live_id_is_left_to_it(db: SessionDB, tmp_path: Path) -> None:
    """``request_dump_a_b_1.json`` could be session ``a``'s or ``a_b``'s: deleting ``a``
    while ``a_b`` lives keeps it; once ``a_b`` goes too, it is removed."""
    folder = tmp_path / "sessions"
    folder.mkdir()
    for n in ("request_dump_a_1.json", "request_dump_a_b_1.json", "a.json", "a_b.json"):
        (folder / n).write_text(n)
    for sid in ("a", "a_b"):
        db.create_session(sid, "cli")
        set_times(db, sid, started_at=OLD, ended_at=OLD + 1, end_reason="done", messages_at=OLD)
    db.delete_session("a", sessions_dir=folder)
    assert sorted(os.listdir(folder)) == ["a_b.json", "request_dump_a_b_1.json"]
    db.create_session("a", "cli")
    set_times(db, "a", started_at=OLD, ended_at=OLD + 1, end_reason="done", messages_at=OLD)
    (folder / "request_dump_a_2.json").write_text("x")
    assert db.prune_sessions(older_than_days=90, sessions_dir=folder) == 2  # both go: all files go
    assert os.listdir(folder) == []


def test_transcripts_stay_when_the_delete_rolls_back(tmp_path: Path) -> None:
    """Files go only after the rows are committed: a failed transaction keeps both."""
    from hermes_store import UnitOfWork
    from hermes_store.engine import create_engine

    db = tmp_path / "state.db"
    folder = tmp_path / "sessions"
    folder.mkdir()
    with SessionDB(db) as sdb:
        sdb.create_session("keep", "cli")
        sdb.end_session("keep", "done")
    transcript = folder / "keep.json"
    transcript.write_text("{}")
    engine = create_engine(db)
    with pytest.raises(RuntimeError):
        with UnitOfWork(engine) as uow:
            assert uow.maintenance.delete_session("keep", folder) is True
            assert transcript.exists()  # not before the commit
            raise RuntimeError("the caller's unit of work fails after the delete")
    assert transcript.exists()
    with UnitOfWork(engine) as uow:
        assert uow.sessions.get("keep") is not None
        assert uow.maintenance.delete_session("keep", folder) is True
    assert not transcript.exists()
    engine.dispose()
