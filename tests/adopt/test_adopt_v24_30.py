"""Adoption of every shape a Hermes v24–v30 file (and its neighbours) really has.

The reference files in ``tests/data/hermes-dbs`` are the shapes Hermes *creates*. A
user's file also comes from Hermes *migrating* an older one (columns appended by the
reconciler, no ``system_prompt_hash`` foreign key, old FTS layouts kept; see
HERMES_v24_v30.md §2 and PROVENANCE.md §5), from a SQLite without FTS5 or without the
trigram tokenizer, or from Hermes adding columns without a version bump. Each such file
is built here from the reference files, the way Hermes would have made it, and must
adopt to head with every row and value kept and search working. Every test works on
copies in ``tmp_path``.
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any
from collections.abc import Callable

import pytest

from hermes_store import adopt as adopt_mod
from hermes_store import errors, migrations
from hermes_store.adopt import work as work_mod
from hermes_store.introspect import snapshot

from ..helpers import REPO
from .test_adopt import (
    adopt_and_check,
    fts_ids,
    hermes,
    place,
    ro,
    state,
)


@pytest.fixture(scope="module")
def fresh_head(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    p = tmp_path_factory.mktemp("fresh") / "fresh.db"
    migrations.upgrade(p, "head")
    with ro(p) as conn:
        return snapshot(conn)


# ------------------------------------------------------ how Hermes migrates a file


def _hermes_dedupe_prompts(conn: sqlite3.Connection) -> None:
    """Hermes' v25 ``_dedupe_legacy_system_prompts``: each inline prompt stored once by SHA-256."""
    for sid, prompt in conn.execute("SELECT id, system_prompt FROM sessions WHERE system_prompt IS NOT NULL").fetchall():
        digest = hashlib.sha256(prompt.encode("utf-8")).hexdigest()
        conn.execute("INSERT OR IGNORE INTO system_prompts (hash, prompt) VALUES (?, ?)", (digest, prompt))
        conn.execute("UPDATE sessions SET system_prompt_hash = ?, system_prompt = NULL WHERE id = ?", (digest, sid))


def _objects(conn: sqlite3.Connection, type_: str) -> dict[str, str]:
    return dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = ? AND sql IS NOT NULL ORDER BY rowid", (type_,)))


def migrate_like_hermes(p: Path, to: int) -> None:
    """Open ``p`` as Hermes v``to`` would (HERMES_v24_v30.md §2 and PROVENANCE.md §5).

    ``CREATE TABLE IF NOT EXISTS`` of the newer schema, the reconciler's ``ALTER TABLE
    ADD COLUMN "name" type [NOT NULL] [DEFAULT x]`` (appended, without REFERENCES),
    ``CREATE INDEX IF NOT EXISTS``, the display triggers re-installed on every open, the
    v25 prompt dedupe, then the bump. The trigram objects of the old layout stay (Hermes'
    v29/v30 migration skips a layout-1 trigram table that still has ``tool_calls``);
    late-v30 code realigns the word index to ``messages_fts_src`` (FTS layout 3).
    """
    with ro(hermes(to)) as ref:
        tables = {n: s for n, s in _objects(ref, "table").items() if not s.upper().startswith("CREATE VIRTUAL")
                  and not re.search(r"_(data|idx|content|docsize|config)$", n) and not n.startswith("sqlite_")}
        columns = {t: [r[1:5] for r in ref.execute(f'PRAGMA table_info("{t}")')] for t in tables}
        indexes = _objects(ref, "index")
        triggers = _objects(ref, "trigger")
        views = _objects(ref, "view")
        virtual = {n: s for n, s in _objects(ref, "table").items() if s.upper().startswith("CREATE VIRTUAL")}
    conn = sqlite3.connect(p)
    try:
        version = conn.execute("SELECT version FROM schema_version").fetchone()[0]
        live = set(_objects(conn, "table"))
        for name, sql in tables.items():
            if name not in live:
                conn.execute(sql)
                continue
            have = {r[1] for r in conn.execute(f'PRAGMA table_info("{name}")')}
            for col, typ, notnull, default in columns[name]:
                if col not in have:
                    spec = f'"{col}" {typ}' + (" NOT NULL" if notnull else "") + (f" DEFAULT {default}" if default is not None else "")
                    conn.execute(f'ALTER TABLE "{name}" ADD COLUMN {spec}')
        for name, sql in indexes.items():
            if name not in _objects(conn, "index"):
                conn.execute(sql)
        for name, sql in triggers.items():
            if name.startswith("messages_display_"):
                conn.execute(f"DROP TRIGGER IF EXISTS {name}")
                conn.execute(sql)
        if version < 25 <= to:
            _hermes_dedupe_prompts(conn)
        if to >= 30 and "messages_fts_src" in views:
            for name in ("messages_fts_insert", "messages_fts_delete", "messages_fts_update"):
                conn.execute(f"DROP TRIGGER {name}")
            conn.execute("DROP TABLE messages_fts")
            conn.execute(views["messages_fts_src"])
            conn.execute(virtual["messages_fts"])
            for name in ("messages_fts_insert", "messages_fts_delete", "messages_fts_update"):
                conn.execute(triggers[name])
            conn.execute("INSERT INTO messages_fts(messages_fts) VALUES('rebuild')")
            conn.execute("DELETE FROM state_meta WHERE key = 'fts_tool_full_content_high_water'")
            conn.execute("INSERT OR REPLACE INTO state_meta (key, value) VALUES ('fts_storage_version', '3')")
        conn.execute("UPDATE schema_version SET version = ?", (to,))
        conn.commit()
    finally:
        conn.close()


def _with_prompts_and_an_extra_column(p: Path) -> None:
    """Inline prompts (two identical) and a column Hermes never had, holding data."""
    conn = sqlite3.connect(p)
    conn.execute("ALTER TABLE sessions ADD COLUMN my_label TEXT")
    conn.execute("UPDATE sessions SET my_label = 'label-' || id")
    for sid, prompt in (("compat_000", "You are Hermes."), ("compat_001", "You are Hermes."),
                        ("compat_003", "Système: réponds en français ✓")):
        conn.execute("UPDATE sessions SET system_prompt = ? WHERE id = ?", (prompt, sid))
    conn.commit()
    conn.close()


@pytest.mark.parametrize("start, to", [(24, 25), (24, 26), ("23_late", 29), ("23_late", 30), (24, 30)])
def test_a_file_hermes_migrated_adopts(start: int | str, to: int, tmp_path: Path, fresh_head: dict[str, Any]) -> None:
    p = place(hermes(start), tmp_path)
    _with_prompts_and_an_extra_column(p)
    with ro(p) as conn:
        labels = dict(conn.execute("SELECT id, my_label FROM sessions"))
        prompts = dict(conn.execute("SELECT id, system_prompt FROM sessions"))
    migrate_like_hermes(p, to)
    with ro(p) as conn:
        live = snapshot(conn)
        # The migrated shape: no foreign key on the appended hash column.
        assert "system_prompt_hash->system_prompts.hash" not in live["tables"]["sessions"]["fks"]
        assert live["tables"]["sessions"]["order"][-1] != "my_label"  # columns were appended after it

    det = adopt_mod.detect(p)
    assert det.adoptable and det.extra_columns == {"sessions": ["my_label"]}
    kinds = {r.kind for r in det.repairs}
    assert "add_foreign_key" in kinds
    assert ("fts_reset" in kinds) == (to >= 29)  # the v24 trigram layout kept under 29/30
    adopt_and_check(p, fresh_head, extra=("my_label",))

    with ro(p) as conn:
        fks = {(r[3], r[2], r[4]) for r in conn.execute('PRAGMA foreign_key_list("sessions")')}
        assert ("system_prompt_hash", "system_prompts", "hash") in fks
        assert dict(conn.execute("SELECT id, my_label FROM sessions")) == labels
        resolved = dict(conn.execute(
            "SELECT s.id, COALESCE(sp.prompt, s.system_prompt) FROM sessions s "
            "LEFT JOIN system_prompts sp ON sp.hash = s.system_prompt_hash"
        ))
        assert resolved == prompts
        assert conn.execute("SELECT count(*) FROM system_prompts").fetchone()[0] == 2
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []


def test_a_fresh_v25_file_keeps_its_table_level_key_and_downgrades(tmp_path: Path, fresh_head: dict[str, Any]) -> None:
    """Only a file Hermes created at v25+ declares the key as a table constraint;
    adopted, it is head's schema, and revision 0025's downgrade still handles it."""
    p = place(hermes(26), tmp_path)
    adopt_and_check(p, fresh_head)
    assert migrations.downgrade(p, "0024") == "0024"
    with ro(p) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == 24
        assert "system_prompt_hash" not in {r[1] for r in conn.execute('PRAGMA table_info("sessions")')}
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 60


# --------------------------------------------------- columns added without a bump


def test_late_v23_values_are_kept(tmp_path: Path, fresh_head: dict[str, Any]) -> None:
    """Late v23 holds v24's columns; a real one has them filled. Revision 0024 adds them,
    so their values are set aside and put back."""
    p = place(hermes("23_late"), tmp_path)
    conn = sqlite3.connect(p)
    conn.execute("UPDATE sessions SET last_activity_at = started_at + 5, last_activity_provenance = 'unknown', "
                 "pinned = (id = 'compat_002'), compression_ineffective_count = 2")
    conn.execute("UPDATE messages SET display_kind = 'timeline', display_metadata = '{\"n\": ' || id || '}' "
                 "WHERE id % 4 = 0")
    conn.commit()
    conn.close()
    det = adopt_mod.detect(p)
    assert det.shape == "hermes_v23_late" and det.adoptable
    assert {r.column for r in det.repairs if r.kind == "set_aside_column"} == {
        "last_activity_at", "last_activity_provenance", "pinned", "compression_ineffective_count",
        "display_kind", "display_metadata",
    }
    adopt_and_check(p, fresh_head)  # kept() compares every value of every column


def test_late_v26_rows_and_values_are_kept(tmp_path: Path, fresh_head: dict[str, Any]) -> None:
    p = place(hermes("26_late"), tmp_path)
    conn = sqlite3.connect(p)
    conn.execute("UPDATE sessions SET tool_names = 'terminal,web_search' WHERE id IN ('compat_000', 'compat_004')")
    conn.execute("UPDATE messages SET _compressed_summary = 1 WHERE id = 12")
    conn.execute("INSERT INTO conversation_generations VALUES ('telegram', 'chat:1', 3), ('cli', 'k', 1)")
    conn.execute("INSERT INTO gateway_heartbeats VALUES ('b1', 42, 1.5, 2.5, 'default', 'host-a')")
    conn.commit()
    generations = conn.execute("SELECT * FROM conversation_generations ORDER BY rowid").fetchall()
    beats = conn.execute("SELECT * FROM gateway_heartbeats").fetchall()
    conn.close()
    kinds = {r.kind for r in adopt_mod.detect(p).repairs}
    assert {"set_aside_table", "set_aside_column"} <= kinds
    adopt_and_check(p, fresh_head)
    with ro(p) as conn:
        assert conn.execute("SELECT * FROM conversation_generations ORDER BY rowid").fetchall() == generations
        assert conn.execute("SELECT * FROM gateway_heartbeats").fetchall() == beats


def test_values_a_target_revision_cannot_hold_are_refused(tmp_path: Path) -> None:
    """Adopting late v23 only up to our hs0001 would leave v24's columns nowhere."""
    p = place(hermes("23_late"), tmp_path)
    conn = sqlite3.connect(p)
    conn.execute("UPDATE sessions SET last_activity_at = 1.0")
    conn.commit()
    conn.close()
    before = state(p)
    with pytest.raises(errors.AdoptionError, match="last_activity_at"):
        adopt_mod.adopt(p, revision="hs0001")
    assert state(p) == before


def test_a_failure_while_putting_values_back_leaves_the_original(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = place(hermes("23_late"), tmp_path)
    conn = sqlite3.connect(p)
    conn.execute("UPDATE sessions SET pinned = 1")
    conn.commit()
    conn.close()
    before = state(p)

    def boom(*_a: Any, **_k: Any) -> None:
        raise RuntimeError("injected failure")

    monkeypatch.setattr(work_mod, "_put_back", boom)
    with pytest.raises(errors.AdoptionError) as info:
        adopt_mod.adopt(p)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert state(p) == before


# ------------------------------------------- pieces Hermes itself does without


FTS_PREFIX = "messages_fts"


def _drop(conn: sqlite3.Connection, type_: str, name: str) -> None:
    conn.execute(f'DROP {type_.upper()} "{name}"')


def _drop_trigram(conn: sqlite3.Connection) -> None:
    """A SQLite without the trigram tokenizer: Hermes creates no trigram objects."""
    for type_, name in conn.execute("SELECT type, name FROM sqlite_master WHERE name LIKE 'messages_fts_trigram%' "
                                    "AND type IN ('trigger', 'view')").fetchall():
        _drop(conn, type_, name)
    _drop(conn, "table", "messages_fts_trigram")


def _drop_all_fts(conn: sqlite3.Connection) -> None:
    """A SQLite without FTS5: no index at all, and Hermes keeps writing messages."""
    for type_, name in conn.execute("SELECT type, name FROM sqlite_master WHERE name LIKE 'messages_fts%' "
                                    "AND type IN ('trigger', 'view')").fetchall():
        _drop(conn, type_, name)
    for table in ("messages_fts", "messages_fts_trigram"):
        _drop(conn, "table", table)
    _new_message(conn, "fts5lessword")


def _new_message(conn: sqlite3.Connection, word: str) -> None:
    conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('compat_000', 'user', ?, 2e9)",
                 (f"written without an index {word} 無索引の行",))


def _drop_an_index(conn: sqlite3.Connection) -> None:
    name = conn.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL "
                        "ORDER BY name DESC LIMIT 1").fetchone()[0]
    _drop(conn, "index", name)


def _drop_triggers(conn: sqlite3.Connection) -> None:
    """The word index's insert trigger (so a row goes unindexed) and, where the version
    has any, a trigger that is not about FTS."""
    _drop(conn, "trigger", "messages_fts_insert")
    _new_message(conn, "unindexedword")
    other = conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND name NOT LIKE 'messages_fts%' "
                         "ORDER BY name LIMIT 1").fetchone()
    if other:
        _drop(conn, "trigger", other[0])


def _drop_a_column(conn: sqlite3.Connection) -> None:
    """An older file of this version: a sessions column the reconciler adds later is
    missing. The table is rebuilt without it (as it was before Hermes added it)."""
    sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'sessions'").fetchone()[0]
    info = list(conn.execute('PRAGMA table_info("sessions")'))
    named = " ".join(r[0] for r in conn.execute("SELECT sql FROM sqlite_master WHERE type IN ('index', 'trigger', 'view') "
                                                "AND sql IS NOT NULL"))
    col = next(r[1] for r in reversed(info[:-1]) if r[4] is not None and not r[5] and not re.search(rf"\b{r[1]}\b", named))
    body = re.sub(rf"^\s*{col}\s[^\n]*\n", "", sql, count=1, flags=re.M)
    assert body != sql
    keep = ", ".join(f'"{r[1]}"' for r in info if r[1] != col)
    saved = [s for (s,) in conn.execute("SELECT sql FROM sqlite_master WHERE tbl_name = 'sessions' "
                                        "AND type IN ('index', 'trigger') AND sql IS NOT NULL")]
    conn.execute("PRAGMA legacy_alter_table = ON")
    conn.execute(body.replace("sessions", "sessions_old_shape", 1))
    conn.execute(f"INSERT INTO sessions_old_shape (rowid, {keep}) SELECT rowid, {keep} FROM sessions")
    conn.execute("DROP TABLE sessions")
    conn.execute("ALTER TABLE sessions_old_shape RENAME TO sessions")
    for s in saved:
        conn.execute(s)
    conn.execute("PRAGMA legacy_alter_table = OFF")
    conn.execute("INSERT INTO state_meta (key, value) VALUES ('test.dropped_column', ?)", (col,))


VARIANTS: dict[str, Callable[[sqlite3.Connection], None]] = {
    "no_trigram": _drop_trigram,
    "no_fts": _drop_all_fts,
    "missing_index": _drop_an_index,
    "missing_triggers": _drop_triggers,
    "missing_column": _drop_a_column,
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("version", [11, 23, 25, 30])
def test_pieces_hermes_tolerates_are_repaired(version: int, variant: str, tmp_path: Path, fresh_head: dict[str, Any]) -> None:
    p = place(hermes(version), tmp_path)
    conn = sqlite3.connect(p)
    VARIANTS[variant](conn)
    conn.commit()
    conn.close()
    det = adopt_mod.detect(p)
    assert det.adoptable and det.repairs, det.problems
    adopt_and_check(p, fresh_head)
    with ro(p) as conn:
        for word in ("fts5lessword", "unindexedword"):
            ids = {r[0] for r in conn.execute("SELECT id FROM messages WHERE instr(content, ?) > 0", (word,))}
            assert fts_ids(conn, "messages_fts", word) == ids  # rows written meanwhile are indexed
        dropped = conn.execute("SELECT value FROM state_meta WHERE key = 'test.dropped_column'").fetchone()
        if dropped:  # back, holding its declared default on every row
            default = next(r[4] for r in conn.execute('PRAGMA table_info("sessions")') if r[1] == dropped[0])
            assert conn.execute(f'SELECT count(*) FROM sessions WHERE "{dropped[0]}" IS {default}').fetchone()[0] == 5


# ----------------------------------------------------------------- refusals


def _version(n: int) -> Callable[[Path], None]:
    def make(p: Path) -> None:
        conn = sqlite3.connect(p)
        conn.execute("UPDATE schema_version SET version = ?", (n,))
        conn.commit()
        conn.close()

    return make


def _foreign(p: Path) -> None:
    p.unlink()
    conn = sqlite3.connect(p)
    conn.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, body TEXT)")
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    conn.commit()
    conn.close()


def _corrupt(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[4096 * 8 : 4096 * 9] = bytes(range(256)) * 16
    p.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "make, exc, phrase",
    [
        (_version(31), errors.SchemaTooNewError, "schema_version 31"),
        (_version(99), errors.SchemaTooNewError, "schema_version 99"),
        (_foreign, errors.NotAHermesDatabaseError, "not a Hermes"),
        (_corrupt, errors.NotADatabaseError, "corrupt"),
    ],
    ids=["v31", "v99", "not_hermes", "corrupt"],
)
def test_what_cannot_be_adopted_is_left_unchanged(make: Callable[[Path], None], exc: type, phrase: str, tmp_path: Path) -> None:
    p = place(hermes(30), tmp_path)
    make(p)
    before = state(p)
    with pytest.raises(exc, match=phrase):
        adopt_mod.adopt(p)
    assert state(p) == before
    with pytest.raises(exc):
        migrations.upgrade(p)
    assert state(p) == before


def test_unknown_columns_of_a_v30_file_are_kept(tmp_path: Path, fresh_head: dict[str, Any]) -> None:
    p = place(hermes("30_early"), tmp_path)
    conn = sqlite3.connect(p)
    conn.execute("ALTER TABLE sessions ADD COLUMN my_label TEXT DEFAULT 'x'")
    conn.execute("UPDATE sessions SET my_label = id || '!'")
    conn.commit()
    conn.close()
    adopt_and_check(p, fresh_head, extra=("my_label",))
    with ro(p) as conn:
        assert dict(conn.execute("SELECT id, my_label FROM sessions")) == {f"compat_00{i}": f"compat_00{i}!" for i in range(5)}


# ------------------------------------------------ our own revisions commute


def test_own_revisions_before_the_file_version_are_applied_in_chain_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stamp the Hermes revision below each of our own, apply it, stamp the file's:
    placed by the chain, so hs0002 (earlier in the chain) comes before hs0001."""
    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(work_mod, "revision_order", lambda: ("0001", "0002", "hs0002", "0003", "hs0001", "0004", "0005"))
    monkeypatch.setattr(work_mod, "_stamp", lambda _p, rev, **_k: calls.append(("stamp", rev)))
    monkeypatch.setattr(work_mod, "_upgrade_copy", lambda _p, rev, **_k: calls.append(("upgrade", rev)))
    work_mod._stamp_as_hermes(tmp_path / "x.db", "0005", version_table="v")
    assert calls == [("stamp", "0002"), ("upgrade", "hs0002"), ("stamp", "0003"), ("upgrade", "hs0001"), ("stamp", "0005")]
    calls.clear()
    work_mod._stamp_as_hermes(tmp_path / "x.db", "0002", version_table="v")
    assert calls == [("stamp", "0002")]


def test_a_v24_file_gets_our_revisions_below_24(tmp_path: Path) -> None:
    """hs0001 sits between 0023 and 0024: a v24 file adopted only to 0024 has its objects."""
    p = place(hermes(24), tmp_path)
    adopt_mod.adopt(p, revision="0024")
    assert migrations.current(p) == "0024"
    with ro(p) as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert {"messages_cjk_bigram", "messages_cjk_bigram_dirty", "idx_messages_timestamp"} <= names
        assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == 24
    assert migrations.upgrade(p) == migrations.head()


# ------------------------------------------------------------------- crashes


KILL = r"""
import os, sys
from hermes_store.adopt import swap
swap.fault_hook = lambda step: os._exit(77) if step == sys.argv[2] else None
from hermes_store import adopt
adopt.adopt(sys.argv[1])
sys.exit(3)
"""


@pytest.mark.parametrize("step", ["repairing", "verified"])
def test_a_kill_while_repairing_a_migrated_file_loses_nothing(step: str, tmp_path: Path, fresh_head: dict[str, Any]) -> None:
    p = place(hermes(24), tmp_path)
    _with_prompts_and_an_extra_column(p)
    migrate_like_hermes(p, 30)
    before = state(p)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", KILL, str(p), step], env=env, capture_output=True, timeout=120)
    assert done.returncode == 77, done.stderr.decode()
    assert state(p)[0] == before[0]  # the original's bytes (a temp copy may be left for the next open)
    adopt_and_check(p, fresh_head, extra=("my_label",))


# ------------------------------------------------------- long tool rows (v28+)


def _long_tool_row(p: Path) -> int:
    """A tool result longer than the 8192 characters v28+ word indexes keep, written
    through Hermes' own triggers (so it is indexed truncated)."""
    conn = sqlite3.connect(p)
    try:
        cur = conn.execute(
            "INSERT INTO messages (session_id, role, content, tool_name, timestamp) VALUES ('compat_000', 'tool', ?, 'terminal', 2e9)",
            ("headtoken " + "x " * 5000 + "tailtoken",),
        )
        conn.commit()
        return cur.lastrowid  # type: ignore[return-value]
    finally:
        conn.close()


@pytest.mark.parametrize("name", ["28", "29_late", "30_early"])
def test_a_long_tool_row_adopts_to_head_consistently(name: str, tmp_path: Path, fresh_head: dict[str, Any]) -> None:
    """Before FTS layout 3 the word index held a truncated tool row but read the full
    one back (upstream defect #114169; FTS5's rank=1 check fails). At head the index
    reads what it stores: the first 8192 characters."""
    p = place(hermes(name), tmp_path)
    mid = _long_tool_row(p)
    adopt_and_check(p, fresh_head)  # includes integrity-check with rank = 1
    with ro(p) as conn:
        assert mid in fts_ids(conn, "messages_fts", "headtoken")
        assert mid not in fts_ids(conn, "messages_fts", "tailtoken")


def test_a_long_tool_row_adopted_to_v28_is_indexed_consistently(tmp_path: Path) -> None:
    """Adopted only to 0028, the re-index covers every row in full and moves v28's mark
    past it (as Hermes' own rebuild does), so its triggers later delete what is stored."""
    p = place(hermes(28), tmp_path)
    mid = _long_tool_row(p)
    adopt_mod.adopt(p, revision="0028")
    conn = sqlite3.connect(p)
    try:
        conn.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES('integrity-check', 1)")
        mark = conn.execute("SELECT value FROM state_meta WHERE key = 'fts_tool_full_content_high_water'").fetchone()
        assert int(mark[0]) == mid
        assert mid in fts_ids(conn, "messages_fts", "tailtoken")
        conn.execute("DELETE FROM messages WHERE id = ?", (mid,))
        conn.commit()
        conn.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES('integrity-check', 1)")
        assert not fts_ids(conn, "messages_fts", "headtoken")
    finally:
        conn.close()
