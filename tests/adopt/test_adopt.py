"""Adoption of state.db files written by Hermes itself (section 6 of the spec).

Every test works on a copy of ``tests/data/hermes-dbs`` in ``tmp_path``; the data
folder is never written. "Unchanged" is always checked as the SHA-256 of the file plus
the exact listing of its folder (no leftover copy, backup or sidecar).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import pytest

from hermes_store import adopt as adopt_mod
from hermes_store.adopt import swap as swap_mod
from hermes_store.adopt import work as work_mod
from hermes_store import SessionDB, errors, migrations
from hermes_store.engine import create_engine
from hermes_store.introspect import diff, snapshot

from ..helpers import HERMES_DBS, SCHEMA_DIR

HERMES_FILES = sorted(HERMES_DBS.glob("*.db"))
CJK = re.compile(r"[\u4e00-\u9fff\u3400-\u4dbf\u3040-\u309f\u30a0-\u30ff\uac00-\ud7af]{3,}")


# ------------------------------------------------------------------------ helpers


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def state(p: Path) -> tuple[str, list[str]]:
    """What must not change when adoption refuses or fails: the bytes and the folder."""
    return sha(p), sorted(os.listdir(p.parent))


def place(src: Path, tmp_path: Path, name: str = "state.db") -> Path:
    """Copy a reference file into the test's own folder (writable, like a real state.db)."""
    folder = tmp_path / "home"
    folder.mkdir(exist_ok=True)
    dst = folder / name
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o644)
    return dst


def hermes(n: int | str) -> Path:
    return HERMES_DBS / f"hermes_v{n}.db"


@contextmanager
def ro(p: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection, closed afterwards (sqlite3's own ``with`` does not close)."""
    conn = sqlite3.connect(p.absolute().as_uri() + "?mode=ro", uri=True)
    try:
        yield conn
    finally:
        conn.close()


def rows(conn: sqlite3.Connection, table: str, skip: tuple[str, ...] = ()) -> dict[Any, dict[str, Any]]:
    """Every row of ``table`` by rowid, as {column: value} (adoption may reorder columns)."""
    cols = [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")') if r[1] not in skip]
    sql = f'SELECT rowid, {", ".join(chr(34) + c + chr(34) for c in cols)} FROM "{table}" ORDER BY rowid'
    return {r[0]: dict(zip(cols, r[1:], strict=True)) for r in conn.execute(sql)}


def sessions_as_read(conn: sqlite3.Connection) -> dict[Any, dict[str, Any]]:
    """Sessions by rowid; ``system_prompt`` as readers resolve it (v25 stores prompts once,
    by hash), ``model_config`` left out (revision 0016 tags delegates in it)."""
    out = rows(conn, "sessions", skip=("model_config",))
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'system_prompts'").fetchone():
        for rowid, prompt in conn.execute(
            "SELECT s.rowid, COALESCE(sp.prompt, s.system_prompt) FROM sessions s "
            "LEFT JOIN system_prompts sp ON sp.hash = s.system_prompt_hash"
        ):
            out[rowid]["system_prompt"] = prompt
    return out


def kept(before: dict[Any, dict[str, Any]], after: dict[Any, dict[str, Any]]) -> None:
    """Every row and every value the original had is still there, under the same key."""
    assert set(after) >= set(before)
    for key, row in before.items():
        assert {c: after[key].get(c, "<missing>") for c in row} == row, key


#: state_meta keys that describe the FTS indexes, not data: a full re-index closes a
#: pending rebuild window, and revision 0030 deletes v28's tool-row mark (as Hermes does
#: when it moves a file to FTS layout 3).
FTS_BOOKKEEPING = "('fts_rebuild_high_water', 'fts_rebuild_progress', 'fts_tool_full_content_high_water')"


def plain_counts(conn: sqlite3.Connection) -> dict[str, int]:
    """Rows per plain table; state_meta without hermes_store's own and FTS bookkeeping keys."""
    out = {}
    for name, sql in conn.execute("SELECT name, sql FROM sqlite_master WHERE type='table'").fetchall():
        if name.startswith("sqlite_") or "VIRTUAL" in (sql or "").upper() or re.search(
            r"_(data|idx|content|docsize|config)$", name
        ):
            continue
        if name == migrations.VERSION_TABLE:
            continue
        where = f" WHERE substr(key, 1, 13) <> 'hermes_store.' AND key NOT IN {FTS_BOOKKEEPING}" if name == "state_meta" else ""
        out[name] = conn.execute(f'SELECT count(*) FROM "{name}"{where}').fetchone()[0]
    return out


@pytest.fixture(scope="module")
def fresh_head(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Schema of an empty database after ``upgrade head``: what every adoption must equal."""
    p = tmp_path_factory.mktemp("fresh") / "fresh.db"
    migrations.upgrade(p, "head")
    with ro(p) as conn:
        return snapshot(conn)


def fts_ids(conn: sqlite3.Connection, table: str, phrase: str) -> set[int]:
    quoted = '"' + phrase.replace('"', '""') + '"'
    return {r[0] for r in conn.execute(f"SELECT rowid FROM {table} WHERE {table} MATCH ?", (quoted,))}


def delegated(model_config: str | None) -> bool:
    """A ``_delegate_from`` marker, read as Hermes v30's trigram predicate reads it
    (malformed JSON, a non-object or a JSON null is no marker)."""
    try:
        mc = json.loads(model_config or "{}")
    except ValueError:
        return False
    return isinstance(mc, dict) and mc.get("_delegate_from") is not None


def trigram_rows(conn: sqlite3.Connection) -> set[int]:
    """Messages the trigram index must hold, by the file's Hermes version: every row
    up to v22; no tool rows from v23; no cron sessions from v29; no subagent or
    delegated (``_delegate_from``) sessions from v30. Derived from the rows themselves."""
    version = conn.execute("SELECT version FROM schema_version").fetchone()[0]
    sessions = {sid: (source, mc) for sid, source, mc in conn.execute("SELECT id, source, model_config FROM sessions")}
    out = set()
    for mid, sid, role in conn.execute("SELECT id, session_id, role FROM messages"):
        source, mc = sessions.get(sid, (None, None))
        if version >= 23 and role == "tool":
            continue
        if version >= 29 and source == "cron":
            continue
        if version >= 30 and (source == "subagent" or delegated(mc)):
            continue
        out.add(mid)
    return out


#: Characters of a tool result the v28+ word index keeps.
TOOL_PREFIX = 8192


def bounded_tool_rows(conn: sqlite3.Connection) -> set[int]:
    """Messages whose tool content the word index keeps only a prefix of: every row in
    FTS layout 3 (``messages_fts_src``), rows above v28's mark where its triggers are."""
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    if "messages_fts_src" in names:
        return {r[0] for r in conn.execute("SELECT id FROM messages")}
    mark = None
    if "state_meta" in names:
        mark = conn.execute("SELECT value FROM state_meta WHERE key = 'fts_tool_full_content_high_water'").fetchone()
    if mark is None:
        return set()
    return {r[0] for r in conn.execute("SELECT id FROM messages WHERE id > ?", (int(mark[0]),))}


def assert_every_message_searchable(conn: sqlite3.Connection) -> None:
    """Every word of every message is in the word index; the trigram index holds
    exactly the rows the file's version puts there (a row it leaves out is still found
    by its words, and by a plain substring scan)."""
    in_trigram = trigram_rows(conn)
    bounded = bounded_tool_rows(conn)
    checked = 0
    for mid, role, content, tool_name, tool_calls in conn.execute(
        "SELECT id, role, content, tool_name, tool_calls FROM messages"
    ).fetchall():
        text = content or ""
        words = re.findall(r"[^\W_]+", text)
        if role == "tool" and mid in bounded and len(text) > TOOL_PREFIX:
            # The word index keeps a long tool result's first 8192 characters (v28+).
            words = re.findall(r"[^\W_]+", text[:TOOL_PREFIX])
            if re.match(r"[^\W_]{2}", text[TOOL_PREFIX - 1 : TOOL_PREFIX + 1]):
                words.pop()  # cut in two at the boundary
        # unicode61 splits on everything but letters and digits; a CJK run glued to
        # Latin letters ("讨论A2A通信") is one token, found whole.
        for word in set(words):
            assert mid in fts_ids(conn, "messages_fts", word), (mid, word)
            checked += 1
        for run in CJK.findall(text):
            piece = run[:3]
            hits = fts_ids(conn, "messages_fts_trigram", piece)
            if mid in in_trigram:
                assert mid in hits, (mid, piece)
            else:
                assert mid not in hits, (mid, piece)
                like = {r[0] for r in conn.execute("SELECT id FROM messages WHERE content LIKE ?", (f"%{piece}%",))}
                assert mid in like, (mid, piece)
            checked += 1
        if tool_name:
            assert mid in fts_ids(conn, "messages_fts", tool_name), (mid, tool_name)
            checked += 1
        if tool_calls:
            for call in json.loads(tool_calls):
                fn = call["function"]
                assert mid in fts_ids(conn, "messages_fts", fn["name"]), (mid, fn["name"])
                for value in json.loads(fn["arguments"]).values():
                    for token in re.findall(r"[A-Za-z0-9]{2,}", str(value)):
                        assert mid in fts_ids(conn, "messages_fts", token), (mid, token)
            checked += 1
    assert checked > 0


def assert_cjk_search_follows_the_index(p: Path) -> None:
    """What a user gets: a CJK search returns the sessions whose rows the trigram index
    holds, and none of those it leaves out (Hermes v30: cron, subagent, delegated)."""
    with ro(p) as conn:
        in_trigram = trigram_rows(conn)
        texts = conn.execute("SELECT id, session_id, content FROM messages").fetchall()
    pieces = {run[:3] for _mid, _sid, text in texts for run in CJK.findall(text or "")}
    db = SessionDB(p)
    try:
        for piece in sorted(pieces):
            want = {sid for mid, sid, text in texts if piece in (text or "") and mid in in_trigram}
            got = {h["session_id"] for h in db.search_messages(piece, limit=1000)}
            assert got == want, piece
    finally:
        db.close()


# --------------------------------------------------------------- every Hermes file


def without(live: dict[str, Any], table: str, *cols: str) -> dict[str, Any]:
    """``live`` without unknown columns the test added on purpose (they are kept)."""
    for col in cols:
        del live["tables"][table]["columns"][col]
    return live


def adopt_and_check(p: Path, fresh_head: dict[str, Any], *, extra: tuple[str, ...] = ()) -> adopt_mod.AdoptionReport:
    """Adopt ``p``; then the schema is head's, every row and value is kept, the FTS
    indexes pass FTS5's strictest check and search finds what it must."""
    with ro(p) as before:
        counts = plain_counts(before)
        messages = rows(before, "messages")
        sessions = sessions_as_read(before)
    report = adopt_mod.adopt(p)
    assert report.adopted and report.revision == migrations.head()
    assert sorted(os.listdir(p.parent)) == ["state.db", "state.db.pre-adopt.bak"]
    with ro(p) as conn:
        assert diff(fresh_head, without(snapshot(conn), "sessions", *extra)) == []
        assert {t: n for t, n in plain_counts(conn).items() if t in counts} == counts
        kept(messages, rows(conn, "messages"))
        kept(sessions, sessions_as_read(conn))
        assert_every_message_searchable(conn)
    conn = sqlite3.connect(p)
    try:
        for table in ("messages_fts", "messages_fts_trigram"):
            conn.execute(f"INSERT INTO {table}({table}, rank) VALUES('integrity-check', 1)")
    finally:
        conn.close()
    assert_cjk_search_follows_the_index(p)
    return report


@pytest.mark.parametrize("src", HERMES_FILES, ids=lambda p: p.stem)
def test_every_hermes_file_adopts_to_head(src: Path, tmp_path: Path, fresh_head: dict[str, Any]) -> None:
    p = place(src, tmp_path)
    original_sha = sha(p)
    report = adopt_and_check(p, fresh_head)
    assert report.backup_path == p.with_name("state.db.pre-adopt.bak")
    assert sha(report.backup_path) == original_sha  # the original, byte for byte
    assert migrations.current(p) == migrations.head()


def test_adopted_file_keeps_indexing_new_rows(tmp_path: Path) -> None:
    p = place(hermes(10), tmp_path)
    adopt_mod.adopt(p)
    conn = sqlite3.connect(p)
    try:
        conn.execute(
            "INSERT INTO messages (session_id, role, content, tool_name, timestamp) "
            "VALUES ('compat_000', 'assistant', 'brandnewword 新しい検索語', 'fresh_tool', 1e9)"
        )
        conn.commit()
        mid = conn.execute("SELECT max(id) FROM messages").fetchone()[0]
        assert mid in fts_ids(conn, "messages_fts", "brandnewword")
        assert mid in fts_ids(conn, "messages_fts", "fresh_tool")
        assert mid in fts_ids(conn, "messages_fts_trigram", "検索語")
    finally:
        conn.close()


# ----------------------------------------------------------------------- detection


#: What turns each variant into the shape its revision reproduces (PROVENANCE.md).
VARIANT_REPAIRS = {
    "hermes_v10_late": {"fts_reset"},  # inline FTS tables
    "hermes_v23_late": {"drop_object", "drop_column"},  # v24's columns and index, only defaults here
    "hermes_v26_late": {"drop_object", "drop_table", "drop_column"},  # v27's, likewise
    "hermes_v29_late": {"fts_reset"},  # FTS layout 2
    "hermes_v30_early": {"add_column", "create_object", "fts_reset"},  # late v30 adds columns, layout 3
}


@pytest.mark.parametrize("src", HERMES_FILES, ids=lambda p: p.stem)
def test_detect_reads_version_and_shape_without_writing(src: Path, tmp_path: Path) -> None:
    p = place(src, tmp_path)
    before = state(p)
    det = adopt_mod.detect(p)
    assert state(p) == before
    assert det.adoptable and not det.problems
    with ro(p) as conn:
        version = conn.execute("SELECT version FROM schema_version").fetchone()[0]
    assert det.schema_version == version and det.revision == f"{version:04d}"
    # hermes_v10.db is the late-v10 shape; hermes_v10_external_fts.db the documented one.
    shape = "hermes_v10_late" if src.name == "hermes_v10.db" else re.sub(r"_external_fts$", "", src.stem)
    assert det.shape == shape
    if shape == f"hermes_v{version}":
        assert det.repairs == []  # the very shape revision 00NN reproduces
    else:
        # A variant Hermes wrote under the same number: repaired into that shape.
        assert det.repairs and {r.kind for r in det.repairs} <= VARIANT_REPAIRS[shape]


def test_detect_leaves_no_sidecars_on_a_wal_file(tmp_path: Path) -> None:
    """Hermes runs in WAL mode; a reader must not leave -wal/-shm files behind."""
    p = place(hermes(12), tmp_path)
    conn = sqlite3.connect(p)
    conn.execute("PRAGMA journal_mode=wal")
    conn.close()
    before = state(p)
    adopt_mod.detect(p)
    assert state(p) == before


def test_v11_without_handoff_columns_gets_them(tmp_path: Path, fresh_head: dict[str, Any]) -> None:
    p = place(hermes(11), tmp_path)
    conn = sqlite3.connect(p)
    for col in ("handoff_state", "handoff_platform", "handoff_error"):
        conn.execute(f"ALTER TABLE sessions DROP COLUMN {col}")
    conn.commit()
    conn.close()

    det = adopt_mod.detect(p)
    assert [(r.kind, r.column) for r in det.repairs] == [
        ("add_column", "handoff_state"),
        ("add_column", "handoff_platform"),
        ("add_column", "handoff_error"),
    ]
    report = adopt_mod.adopt(p)
    assert len(report.repairs) == 3
    with ro(p) as conn:
        assert diff(fresh_head, snapshot(conn)) == []
        assert plain_counts(conn)["messages"] == 60


def test_unknown_extra_columns_are_kept(tmp_path: Path, fresh_head: dict[str, Any]) -> None:
    p = place(hermes(14), tmp_path)
    conn = sqlite3.connect(p)
    conn.execute("ALTER TABLE sessions ADD COLUMN future_flag TEXT DEFAULT 'x'")
    conn.execute("ALTER TABLE messages ADD COLUMN future_score REAL")
    conn.execute("UPDATE messages SET future_score = id * 1.5")
    conn.commit()
    conn.close()

    det = adopt_mod.detect(p)
    assert det.extra_columns == {"sessions": ["future_flag"], "messages": ["future_score"]}
    assert any("future_flag" in n for n in det.notes)
    adopt_mod.adopt(p)
    with ro(p) as conn:
        live = snapshot(conn)
        assert live["tables"]["sessions"]["columns"]["future_flag"] == "TEXT DEFAULT 'x'"
        assert conn.execute("SELECT sum(future_score = id * 1.5) FROM messages").fetchone()[0] == 60
        for table, col in (("sessions", "future_flag"), ("messages", "future_score")):
            del live["tables"][table]["columns"][col]
        assert diff(fresh_head, live) == []


def test_unknown_column_a_revision_would_drop_is_refused(tmp_path: Path) -> None:
    """0022 rebuilds session_model_usage from a fixed column list; losing data is refused."""
    p = place(hermes(21), tmp_path)
    conn = sqlite3.connect(p)
    conn.execute("ALTER TABLE session_model_usage ADD COLUMN note TEXT")
    conn.commit()
    conn.close()
    before = state(p)
    with pytest.raises(errors.AdoptionError, match=r"session_model_usage\.note"):
        adopt_mod.adopt(p)
    assert state(p) == before


def test_column_of_a_later_version_holding_data_is_kept(tmp_path: Path, fresh_head: dict[str, Any]) -> None:
    """Hermes adds columns without bumping the version; the revision that adds the
    column would fail on it, so its values are set aside and put back after the upgrade."""
    p = place(hermes(11), tmp_path)
    conn = sqlite3.connect(p)
    conn.execute("ALTER TABLE messages ADD COLUMN platform_message_id TEXT")  # a v12 column
    conn.execute("UPDATE messages SET platform_message_id = 'tg-' || id WHERE id % 3 = 0")
    conn.commit()
    wanted = dict(conn.execute("SELECT id, platform_message_id FROM messages"))
    conn.close()
    det = adopt_mod.detect(p)
    assert det.adoptable
    assert [(r.kind, r.column) for r in det.repairs] == [("set_aside_column", "platform_message_id")]
    adopt_mod.adopt(p)
    with ro(p) as conn:
        assert diff(fresh_head, snapshot(conn)) == []
        assert dict(conn.execute("SELECT id, platform_message_id FROM messages")) == wanted
        assert not conn.execute("SELECT name FROM sqlite_master WHERE instr(name, '_hermes_store_adopt') = 1").fetchall()


def test_column_of_a_later_version_with_another_type_is_refused(tmp_path: Path) -> None:
    p = place(hermes(11), tmp_path)
    conn = sqlite3.connect(p)
    conn.execute("ALTER TABLE messages ADD COLUMN platform_message_id INTEGER")  # v12 has TEXT
    conn.execute("UPDATE messages SET platform_message_id = id WHERE id = 3")
    conn.commit()
    conn.close()
    before = state(p)
    det = adopt_mod.detect(p)
    assert not det.adoptable and "platform_message_id" in det.problems[0]
    with pytest.raises(errors.AdoptionError, match="platform_message_id"):
        adopt_mod.adopt(p)
    assert state(p) == before


# ------------------------------------------------------------------ WAL and backup


def _hot_wal_copy(tmp_path: Path) -> Path:
    """A state.db plus an uncheckpointed -wal, as left by a Hermes that was killed."""
    work = tmp_path / "live"
    work.mkdir()
    live = place(hermes(11), work)
    writer = sqlite3.connect(live)
    writer.execute("PRAGMA journal_mode=wal")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("INSERT INTO sessions (id, source, started_at) VALUES ('wal_only', 'cli', 2e9)")
    writer.execute(
        "INSERT INTO messages (session_id, role, content, timestamp) VALUES ('wal_only', 'user', 'walword', 2e9)"
    )
    writer.commit()
    folder = tmp_path / "home"
    folder.mkdir()
    shutil.copyfile(live, folder / "state.db")
    shutil.copyfile(f"{live}-wal", folder / "state.db-wal")
    writer.close()
    return folder / "state.db"


def test_wal_content_is_adopted_and_kept_with_the_backup(tmp_path: Path) -> None:
    """The WAL's rows are in the adopted file, and in the backup: one file, the
    original's WAL folded into it, so nothing needs a sidecar to be read."""
    p = _hot_wal_copy(tmp_path)

    report = adopt_mod.adopt(p)

    assert sorted(os.listdir(p.parent)) == ["state.db", "state.db.pre-adopt.bak"]
    assert report.backup_wal_path is None
    with ro(p) as conn:
        assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == 6
        (mid,) = conn.execute("SELECT id FROM messages WHERE content = 'walword'").fetchone()
        assert mid in fts_ids(conn, "messages_fts", "walword")
    # The backup alone opens as the original database, WAL rows included.
    restored = tmp_path / "restored"
    restored.mkdir()
    shutil.copyfile(report.backup_path, restored / "x.db")
    conn = sqlite3.connect(restored / "x.db")
    try:
        assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == 6
        assert conn.execute("SELECT count(*) FROM messages WHERE content = 'walword'").fetchone()[0] == 1
        assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == 11
    finally:
        conn.close()


def test_failed_adoption_of_a_wal_file_leaves_both_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = _hot_wal_copy(tmp_path)
    before = (sha(p), sha(Path(f"{p}-wal")))
    monkeypatch.setattr(work_mod, "_check_fts", _boom)
    with pytest.raises(errors.AdoptionError):
        adopt_mod.adopt(p)
    assert (sha(p), sha(Path(f"{p}-wal"))) == before
    assert set(os.listdir(p.parent)) <= {"state.db", "state.db-wal", "state.db-shm"}


def test_an_existing_backup_is_never_overwritten(tmp_path: Path) -> None:
    p = place(hermes(9), tmp_path)
    older = p.with_name("state.db.pre-adopt.bak")
    older.write_bytes(b"an older backup")
    report = adopt_mod.adopt(p)
    assert older.read_bytes() == b"an older backup"
    assert report.backup_path == p.with_name("state.db.pre-adopt.1.bak")


def test_without_backup_only_the_adopted_file_remains(tmp_path: Path) -> None:
    p = place(hermes(9), tmp_path)
    report = adopt_mod.adopt(p, backup=False)
    assert report.backup_path is None
    assert os.listdir(p.parent) == ["state.db"]
    assert migrations.current(p) == migrations.head()


def test_file_mode_is_kept(tmp_path: Path) -> None:
    p = place(hermes(9), tmp_path)
    os.chmod(p, 0o600)
    adopt_mod.adopt(p)
    assert (p.stat().st_mode & 0o777) == 0o600


# ------------------------------------------------------------- failure injection


def _boom(*_a: Any, **_k: Any) -> None:
    raise RuntimeError("injected failure")


def _upgrade_then_fail(real: Any) -> Any:
    """Let the copy get halfway up the chain, then fail (a crash in the middle)."""

    def upgrade(target: Any, revision: str = "head", **kw: Any) -> Any:
        real(target, "0015", **kw)
        raise RuntimeError("injected failure after 0015")

    return upgrade


def _lose_a_row(real: Any) -> Any:
    """The copy's count after the upgrade comes out one message short."""
    calls = []

    def counts(conn: sqlite3.Connection) -> dict[str, int]:
        out = real(conn)
        calls.append(1)
        if len(calls) > 1:
            out["messages"] -= 1
        return out

    return counts


FAILURES = {
    "stamp": lambda mp: mp.setattr(work_mod, "_stamp", _boom),
    "upgrade_midway": lambda mp: mp.setattr(work_mod, "_upgrade_copy", _upgrade_then_fail(work_mod._upgrade_copy)),
    "fts_check": lambda mp: mp.setattr(work_mod, "_check_fts", _boom),
    "row_counts": lambda mp: mp.setattr(work_mod, "_comparable_counts", _lose_a_row(work_mod._comparable_counts)),
    "schema_verification": lambda mp: mp.setattr(work_mod, "_fresh_snapshot", _boom),
    "backup_copy": lambda mp: mp.setattr(swap_mod, "_private_copy", _boom),
}


@pytest.mark.parametrize(
    "where, version",
    [(w, v) for w in FAILURES for v in ("10", "11", "23") if not (w == "upgrade_midway" and v == "23")],
)
def test_failure_leaves_original_untouched(
    where: str, version: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = place(hermes(version), tmp_path)
    before = state(p)
    FAILURES[where](monkeypatch)
    with pytest.raises(errors.AdoptionError) as info:
        adopt_mod.adopt(p)
    assert state(p) == before
    if where == "row_counts":
        assert "row counts changed" in str(info.value)
    else:
        assert isinstance(info.value.__cause__, RuntimeError)


def test_failure_in_the_final_rename_leaves_original_untouched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """By the rename the original's WAL is folded into it: every row is in state.db
    itself, and nothing of the attempt is left behind."""
    p = _hot_wal_copy(tmp_path)
    with ro(p) as conn:
        before = {t: rows(conn, t) for t in ("sessions", "messages")}
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        if Path(dst) == p:
            raise OSError("injected rename failure")
        real_replace(src, dst)

    monkeypatch.setattr(swap_mod.os, "replace", replace)
    with pytest.raises(errors.AdoptionError) as info:
        adopt_mod.adopt(p)
    assert isinstance(info.value.__cause__, OSError)
    assert sorted(os.listdir(p.parent)) == ["state.db"]
    with ro(p) as conn:
        assert {t: rows(conn, t) for t in ("sessions", "messages")} == before
        assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == 11


def test_interrupt_cleans_up_and_propagates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = place(hermes(11), tmp_path)
    before = state(p)

    def interrupt(*_a: Any, **_k: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(work_mod, "_check_fts", interrupt)
    with pytest.raises(KeyboardInterrupt):
        adopt_mod.adopt(p)
    assert state(p) == before


def _writing_after_copies(p: Path, times: int) -> Any:
    """build_copy, with Hermes writing a session to the original after each of the
    first ``times`` copies."""
    real = work_mod.build_copy
    written: list[str] = []

    def copy_then_write(*args: Any, **kw: Any) -> Any:
        result = real(*args, **kw)
        if len(written) < times:
            written.append(f"late{len(written)}")
            other = sqlite3.connect(p)  # Hermes writing meanwhile
            other.execute("INSERT INTO sessions (id, source, started_at) VALUES (?, 'cli', 3e9)", (written[-1],))
            other.commit()
            other.close()
        return result

    return copy_then_write


def test_a_concurrent_writer_is_kept_by_copying_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = place(hermes(11), tmp_path)
    monkeypatch.setattr(work_mod, "build_copy", _writing_after_copies(p, 1))
    report = adopt_mod.adopt(p)
    assert report.adopted
    assert sorted(os.listdir(p.parent)) == ["state.db", "state.db.pre-adopt.bak"]
    with ro(p) as conn:  # the late row was written after the first copy: the second has it
        assert conn.execute("SELECT count(*) FROM sessions WHERE id = 'late0'").fetchone()[0] == 1


def test_a_writer_that_never_stops_is_refused_with_every_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = place(hermes(11), tmp_path)
    monkeypatch.setattr(work_mod, "build_copy", _writing_after_copies(p, adopt_mod.COPY_ATTEMPTS))
    with pytest.raises(errors.AdoptionError, match="another process"):
        adopt_mod.adopt(p)
    assert sorted(os.listdir(p.parent)) == ["state.db"]
    with ro(p) as conn:  # the late rows are still there, in the original
        assert conn.execute("SELECT count(*) FROM sessions WHERE id LIKE 'late%'").fetchone()[0] == 3
        assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == 11


# ---------------------------------------------------------------------- refusals


def _text_file(p: Path) -> None:
    p.write_text("this is not a database\n" * 100)


def _truncated(p: Path) -> None:
    data = hermes(11).read_bytes()
    p.write_bytes(data[: len(data) // 2])


def _truncated_mid_page(p: Path) -> None:
    data = hermes(11).read_bytes()
    p.write_bytes(data[:10_000])


def _corrupt_page(p: Path) -> None:
    data = bytearray(hermes(11).read_bytes())
    data[4096 * 10 : 4096 * 11] = bytes(range(256)) * 16
    p.write_bytes(bytes(data))


def _schema_99(p: Path) -> None:
    shutil.copyfile(hermes(23), p)
    os.chmod(p, 0o644)
    with sqlite3.connect(p) as conn:
        conn.execute("UPDATE schema_version SET version = 99")
    conn.close()


def _not_hermes(p: Path) -> None:
    with sqlite3.connect(p) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        conn.execute("INSERT INTO notes (body) VALUES ('hello')")
    conn.close()


def _foreign_sessions(p: Path) -> None:
    with sqlite3.connect(p) as conn:
        conn.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, payload TEXT)")
    conn.close()


REFUSALS = {
    "text_file": (_text_file, errors.NotADatabaseError, "not a SQLite database"),
    "truncated": (_truncated, errors.NotADatabaseError, "truncated"),
    "truncated_mid_page": (_truncated_mid_page, errors.NotADatabaseError, "truncated"),
    "corrupt_page": (_corrupt_page, errors.NotADatabaseError, "corrupt"),
    "schema_99": (_schema_99, errors.SchemaTooNewError, "schema_version 99"),
    "not_hermes": (_not_hermes, errors.NotAHermesDatabaseError, "not a Hermes"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_refused_files_are_left_unchanged(case: str, tmp_path: Path) -> None:
    make, exc_type, phrase = REFUSALS[case]
    p = tmp_path / "home" / "state.db"
    p.parent.mkdir()
    make(p)
    before = state(p)
    with pytest.raises(exc_type, match=phrase) as info:
        adopt_mod.adopt(p)
    assert str(p) in str(info.value) and "left unchanged" in str(info.value).lower()
    assert state(p) == before


@pytest.mark.parametrize("case", [c for c in REFUSALS if c != "not_hermes"] + ["foreign_sessions"])
def test_upgrade_refuses_the_same_files(case: str, tmp_path: Path) -> None:
    """``migrations.upgrade`` must not turn garbage into a database either."""
    make, exc_type, _phrase = REFUSALS.get(case, (_foreign_sessions, errors.NotAHermesDatabaseError, ""))
    p = tmp_path / "home" / "state.db"
    p.parent.mkdir()
    make(p)
    before = state(p)
    with pytest.raises(exc_type):
        migrations.upgrade(p)
    assert state(p) == before


def test_unfinished_transaction_is_refused(tmp_path: Path) -> None:
    p = place(hermes(11), tmp_path)
    Path(f"{p}-journal").write_bytes(b"\xd9\xd5\x05\xf9\x20\xa1\x63\xd7" + b"\0" * 504)
    before = state(p)
    with pytest.raises(errors.AdoptionError, match="unfinished transaction"):
        adopt_mod.adopt(p)
    assert state(p) == before


def test_missing_file_is_refused_without_creating_it(tmp_path: Path) -> None:
    p = tmp_path / "nope.db"
    with pytest.raises(errors.DatabaseUnavailableError):
        adopt_mod.adopt(p)
    assert not p.exists()
    assert migrations.current(p) is None and not p.exists()


def test_cannot_adopt_below_the_file_version(tmp_path: Path) -> None:
    p = place(hermes(14), tmp_path)
    before = state(p)
    with pytest.raises(errors.AdoptionError, match="0014 or later"):
        adopt_mod.adopt(p, revision="0012")
    assert state(p) == before


# -------------------------------------------------------- idempotence and entry points


def test_adopting_twice_is_a_no_op(tmp_path: Path) -> None:
    p = place(hermes(16), tmp_path)
    adopt_mod.adopt(p)
    before = state(p)
    again = adopt_mod.adopt(p)
    assert not again.adopted and "already a hermes_store database" in again.message
    assert again.revision == migrations.head()
    assert state(p) == before
    assert adopt_mod.detect(p).already_adopted


def test_upgrade_adopts_an_unstamped_hermes_file(tmp_path: Path, fresh_head: dict[str, Any]) -> None:
    p = place(hermes("10"), tmp_path)
    assert migrations.upgrade(p) == migrations.head()
    assert p.with_name("state.db.pre-adopt.bak").exists()
    with ro(p) as conn:
        assert diff(fresh_head, snapshot(conn)) == []
        assert_every_message_searchable(conn)
    before = state(p)
    assert migrations.upgrade(p) == migrations.head()  # now an ordinary no-op upgrade
    assert state(p) == before


def test_upgrade_by_url_adopts_too(tmp_path: Path) -> None:
    p = place(hermes(5), tmp_path)
    assert migrations.upgrade(f"sqlite:///{p}") == migrations.head()
    assert migrations.current(p) == migrations.head()


def test_upgrade_to_an_intermediate_revision_adopts_to_it(tmp_path: Path) -> None:
    p = place(hermes(8), tmp_path)
    assert migrations.upgrade(p, "0012") == "0012"
    with ro(p) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == 12
        assert_every_message_searchable(conn)


def test_engine_target_asks_for_adoption_first(tmp_path: Path) -> None:
    p = place(hermes(11), tmp_path)
    before = state(p)
    engine = create_engine(p)
    try:
        with pytest.raises(errors.AdoptionError, match="adopt"):
            migrations.upgrade(engine)
    finally:
        engine.dispose()
    assert state(p) == before


def test_progress_is_reported(tmp_path: Path) -> None:
    p = place(hermes(11), tmp_path)
    seen: list[tuple[str, float]] = []
    adopt_mod.adopt(p, progress=lambda stage, fraction: seen.append((stage, fraction)))
    stages = [s for s, _ in seen]
    assert stages[0] == "copy" and stages[-1] == "swap"
    assert {"copy", "upgrade", "verify", "swap"} <= set(stages)
    assert all(0.0 <= f <= 1.0 for _, f in seen)


def test_package_ships_its_reference_schemas() -> None:
    """detect() must not depend on tests/: the package carries the same JSON files."""

    shipped = Path(adopt_mod.__file__).parent.parent / "reference_schemas"
    assert sorted(f.name for f in shipped.glob("*.json")) == sorted(f.name for f in SCHEMA_DIR.glob("*.json"))
    for f in SCHEMA_DIR.glob("*.json"):
        assert json.loads(f.read_text()) == adopt_mod.reference_schema(f.stem.removeprefix("hermes_v"))


def test_a_wal_mode_file_adopts_without_leftover_sidecars(tmp_path: Path) -> None:
    p = place(hermes(13), tmp_path)
    conn = sqlite3.connect(p)
    conn.execute("PRAGMA journal_mode=wal")
    conn.close()
    adopt_mod.adopt(p)
    assert sorted(os.listdir(p.parent)) == ["state.db", "state.db.pre-adopt.bak"]
    with ro(p) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # Hermes' mode is kept


def test_a_symlinked_state_db_keeps_its_link(tmp_path: Path) -> None:
    real = place(hermes(12), tmp_path, name="real.db")
    link = tmp_path / "state.db"
    link.symlink_to(real)
    adopt_mod.adopt(link)
    assert link.is_symlink() and link.resolve() == real
    assert migrations.current(link) == migrations.head()
    assert real.with_name("real.db.pre-adopt.bak").exists()


def test_upgrade_tolerates_another_process_adopting_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another adopter takes the lock first: upgrade waits for it, finds the file
    adopted and carries on with an ordinary upgrade (one adoption, one backup).
    The real two-process race is in test_adopt_crash.py."""
    p = place(hermes(11), tmp_path)
    real_lock = swap_mod.adoption_lock

    def other_process_first(path: Path, **kw: Any) -> Any:
        monkeypatch.setattr(swap_mod, "adoption_lock", real_lock)
        assert adopt_mod.adopt(p).adopted  # the other process wins the lock
        return real_lock(path, **kw)

    monkeypatch.setattr(swap_mod, "adoption_lock", other_process_first)
    assert migrations.upgrade(p) == migrations.head()
    assert sorted(os.listdir(p.parent)) == ["state.db", "state.db.pre-adopt.bak"]


def test_failed_first_upgrade_leaves_no_empty_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed first upgrade leaves no file of its own behind (a 0-byte leftover would
    be taken as a new database, but a stray file where none was is still litter)."""
    p = tmp_path / "new.db"
    monkeypatch.setattr(migrations.command, "upgrade", _boom)
    with pytest.raises(RuntimeError):
        migrations.upgrade(p)
    assert not p.exists()
    monkeypatch.undo()
    assert migrations.upgrade(p) == migrations.head()


def _sql_of(src: Path, name: str) -> str:
    with ro(src) as conn:
        return conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0]


def test_half_migrated_file_is_repaired(tmp_path: Path, fresh_head: dict[str, Any]) -> None:
    """Hermes adds columns first and bumps schema_version last; a crash in between
    leaves a v4 file with v5 columns (only defaults) and a v13 file with v14's empty
    table. The revisions re-create them, so adoption drops them first."""
    p4 = place(hermes(4), tmp_path)
    conn = sqlite3.connect(p4)
    conn.execute("ALTER TABLE sessions ADD COLUMN cache_read_tokens INTEGER DEFAULT 0")
    conn.execute("ALTER TABLE sessions ADD COLUMN billing_provider TEXT")
    conn.commit()
    conn.close()
    det = adopt_mod.detect(p4)
    assert [(r.kind, r.column) for r in det.repairs] == [
        ("drop_column", "cache_read_tokens"),
        ("drop_column", "billing_provider"),
    ]
    adopt_mod.adopt(p4)
    with ro(p4) as conn:
        assert diff(fresh_head, snapshot(conn)) == []

    (tmp_path / "v13").mkdir()
    p13 = place(hermes(13), tmp_path / "v13")
    conn = sqlite3.connect(p13)
    conn.execute(_sql_of(hermes(14), "compression_locks"))
    conn.execute(_sql_of(hermes(14), "idx_compression_locks_expires"))
    conn.commit()
    conn.close()
    det = adopt_mod.detect(p13)
    assert [r.kind for r in det.repairs] == ["drop_object", "drop_table"]
    adopt_mod.adopt(p13)
    with ro(p13) as conn:
        assert diff(fresh_head, snapshot(conn)) == []
        assert plain_counts(conn)["messages"] == 60


def test_early_table_holding_rows_is_kept(tmp_path: Path, fresh_head: dict[str, Any]) -> None:
    p = place(hermes(13), tmp_path)
    conn = sqlite3.connect(p)
    conn.execute(_sql_of(hermes(14), "compression_locks"))
    cols = [r[1] for r in conn.execute("PRAGMA table_info(compression_locks)")]
    conn.execute(
        f"INSERT INTO compression_locks ({', '.join(cols)}) VALUES ({', '.join('1' for _ in cols)})"
    )
    conn.commit()
    wanted = conn.execute("SELECT * FROM compression_locks").fetchall()
    conn.close()
    assert [r.kind for r in adopt_mod.detect(p).repairs] == ["set_aside_table"]
    adopt_mod.adopt(p)
    with ro(p) as conn:
        assert diff(fresh_head, snapshot(conn)) == []
        assert conn.execute("SELECT * FROM compression_locks").fetchall() == wanted


def test_early_table_of_another_shape_is_refused(tmp_path: Path) -> None:
    p = place(hermes(13), tmp_path)
    conn = sqlite3.connect(p)
    conn.execute("CREATE TABLE compression_locks (session_id TEXT PRIMARY KEY, note TEXT)")
    conn.execute("INSERT INTO compression_locks VALUES ('compat_000', 'mine')")
    conn.commit()
    conn.close()
    before = state(p)
    with pytest.raises(errors.AdoptionError, match="compression_locks"):
        adopt_mod.adopt(p)
    assert state(p) == before


@pytest.mark.parametrize("name", ["hermes_v22.db", "hermes_v23.db"])
def test_adopted_ledger_keeps_alembic_check_quiet(tmp_path: Path, name: str) -> None:
    """Hermes writes the ledger FK inline; adoption rewrites it so autogenerate is quiet."""
    from alembic import command

    from hermes_store import migrations as mig

    path = tmp_path / "state.db"
    shutil.copy(HERMES_DBS / name, path)
    mig.upgrade(path)
    command.check(mig.make_config(f"sqlite:///{path}"))
    conn = sqlite3.connect(path)
    fk = conn.execute('PRAGMA foreign_key_list("session_model_usage")').fetchall()
    assert [(r[2], r[3], r[4], r[6]) for r in fk] == [("sessions", "session_id", "id", "CASCADE")]
    conn.close()
