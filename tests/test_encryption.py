"""Encrypted SQLite stores (issue 34, point 1): SQLCipher through our own engine setup.

Every bullet of the point: where a key comes from and that it is never shown; the store
works whole on an encrypted file (migrations, repositories, every search route,
lineage, the CLI, copy and export/import, async); the bytes on disk (the database, its
``-wal`` and ``-journal``) never hold a canary phrase written in messages, titles and
tool output; a wrong or missing key, or a key for a plain file, is a typed refusal
naming what to supply, the file unchanged; PostgreSQL refuses ``key=``.
(The kill tests of encrypt and rekey are in ``test_encryption_kill.py``.)
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from hermes_store import SessionDB, aio, encryption, errors, held_files, migrations
from hermes_store.cli import doctor as doctor_cli, size as size_cli
from hermes_store.engine import create_engine

from .helpers import REPO, required_module
from .test_cli import ok, run

required_module("sqlcipher3", "the encryption tests")

CANARY = "ZEBRA-CANARY-4471"
PASSPHRASE = "correct horse battery staple"
RAW_KEY = "x'" + "3f" * 32 + "'"
WRONG = "Wr0ng-K3y-8812"
SIDECARS = ("", "-wal", "-journal", "-shm")


@pytest.fixture(autouse=True)
def _no_key_from_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's shell may hold a key: these tests set their own."""
    monkeypatch.delenv(encryption.KEY_ENV, raising=False)
    monkeypatch.delenv(encryption.KEY_FILE_ENV, raising=False)


def key_file(folder: Path, secret: str, mode: int = 0o600, name: str = "key") -> Path:
    p = folder / name
    p.write_text(secret + "\n")
    p.chmod(mode)
    return p


def file_bytes(p: Path) -> bytes:
    """The database and its sidecars, read without dropping SQLite's locks (held_files)."""
    out = b""
    for suffix in SIDECARS:
        f = Path(f"{p}{suffix}")
        if f.exists() and f.stat().st_size:
            out += held_files.read_prefix(f, f.stat().st_size)
    return out


def digest(p: Path) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for suffix in SIDECARS:
        f = Path(f"{p}{suffix}")
        found[suffix] = hashlib.sha256(f.read_bytes()).hexdigest() if f.exists() else None
    return found


CORPUS = [
    ("user", f"Deploying the {CANARY} service with kubernetes"),
    ("assistant", "北京天安门广场很大 and the kubectl rollout"),
    ("user", "東京タワーで会いましょう"),
    ("assistant", "日本語のkubectlテキスト"),
    ("tool", f"tool output says {CANARY} exited 0"),
]


def fill(db: SessionDB, sessions: int = 3) -> None:
    for n in range(sessions):
        sid = f"s{n}"
        db.create_session(sid, source="cli", parent_session_id=f"s{n - 1}" if n else None)
        db.set_session_title(sid, f"{CANARY} title {n}")
        for role, content in CORPUS:
            db.append_message(sid, role=role, content=content, tool_name="shell" if role == "tool" else None)


def found(db: SessionDB, query: str) -> list[tuple[str, str]]:
    return sorted((r["session_id"], r.get("snippet") or "") for r in db.search_messages(query, limit=100))


# ------------------------------------------------------------------ keys


def test_a_key_is_never_shown(tmp_path: Path) -> None:
    key = encryption.StoreKey(PASSPHRASE)
    assert PASSPHRASE not in repr(key) and PASSPHRASE not in str(key)
    engine = create_engine(tmp_path / "s.db", key=PASSPHRASE)
    try:
        assert engine.url.password == PASSPHRASE  # it rides on the engine's URL...
        for shown in (repr(engine), str(engine.url), repr(engine.url),
                      engine.url.render_as_string(hide_password=False)):
            assert PASSPHRASE not in shown  # ...and is never rendered
    finally:
        engine.dispose()
    db = SessionDB(tmp_path / "t.db", key=PASSPHRASE)
    try:
        assert PASSPHRASE not in repr(db.url) and PASSPHRASE not in str(db.url)
    finally:
        db.close()
    with pytest.raises(errors.EncryptionKeyError) as refused:
        SessionDB(tmp_path / "t.db", key="not the passphrase")
    assert "not the passphrase" not in str(refused.value) and PASSPHRASE not in str(refused.value)
    with pytest.raises(TypeError):
        import pickle
        pickle.dumps(key)


def test_raw_keys_and_passphrases(tmp_path: Path) -> None:
    assert encryption.StoreKey(RAW_KEY).is_raw
    assert encryption.StoreKey(bytes(range(32))).is_raw
    assert not encryption.StoreKey(PASSPHRASE).is_raw
    assert not encryption.StoreKey("x'abc'").is_raw  # not 64 hex digits: a passphrase
    with pytest.raises(errors.InvalidInputError):
        encryption.StoreKey(b"short")
    with pytest.raises(errors.EncryptionKeyError):
        encryption.StoreKey("")
    for secret in (RAW_KEY, "it's a 'quoted' passphrase"):
        p = tmp_path / f"{hashlib.sha1(secret.encode()).hexdigest()}.db"
        with SessionDB(p, key=secret) as db:
            fill(db, 1)
        with SessionDB(p, key=secret, read_only=True) as db:
            assert db.get_session("s0") is not None


def test_every_source_of_a_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "s.db"
    with SessionDB(p, key=PASSPHRASE) as db:
        fill(db, 1)
    # The URL's password part.
    with SessionDB(f"sqlite://:{PASSPHRASE.replace(' ', '%20')}@/{p}") as db:
        assert db.get_session("s0") is not None
    # $HERMES_STORE_KEY.
    monkeypatch.setenv(encryption.KEY_ENV, PASSPHRASE)
    with SessionDB(p) as db:
        assert db.get_session("s0") is not None
    monkeypatch.delenv(encryption.KEY_ENV)
    # $HERMES_STORE_KEY_FILE, 0600.
    monkeypatch.setenv(encryption.KEY_FILE_ENV, str(key_file(tmp_path, PASSPHRASE)))
    with SessionDB(p) as db:
        assert db.get_session("s0") is not None
    engine = create_engine(p)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM sessions")).scalar() == 1
    finally:
        engine.dispose()


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_key_file_others_may_read_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int) -> None:
    monkeypatch.setenv(encryption.KEY_FILE_ENV, str(key_file(tmp_path, PASSPHRASE, mode)))
    before = list(tmp_path.iterdir())
    with pytest.raises(errors.EncryptionKeyError, match="chmod 600"):
        SessionDB(tmp_path / "s.db")
    assert list(tmp_path.iterdir()) == before  # nothing created
    result = run("--db", tmp_path / "s.db", "sessions")
    assert result.code == 1 and "chmod 600" in result.stderr and PASSPHRASE not in result.stderr


def test_a_key_given_twice_differently_is_refused(tmp_path: Path) -> None:
    with pytest.raises(errors.InvalidInputError):
        create_engine(f"sqlite://:one@/{tmp_path / 's.db'}", key="two")


def test_postgresql_refuses_a_key() -> None:
    with pytest.raises(errors.InvalidInputError, match="server"):
        create_engine("postgresql+psycopg://u@127.0.0.1:9/db", key=PASSPHRASE)


# ------------------------------------------------------------------ the bytes on disk


def test_no_canary_in_the_database_wal_or_journal(tmp_path: Path) -> None:
    p = tmp_path / "s.db"
    db = SessionDB(p, key=PASSPHRASE)
    try:
        fill(db)
        db.append_messages_batch("s0", [{"role": "tool", "content": f"batch {CANARY} {n}"} for n in range(100)])
        assert Path(f"{p}-wal").exists()  # the rows are in the WAL now: it is checked too
        data = file_bytes(p)
        assert data and CANARY.encode() not in data
        assert found(db, CANARY.split("-")[0])  # and the store finds it
    finally:
        db.close()
    assert CANARY.encode() not in file_bytes(p)
    assert not held_files.read_prefix(p, 16).startswith(b"SQLite format 3")
    # A rollback-journal file (DELETE mode) too, with a transaction left in its journal.
    q = tmp_path / "journal.db"
    conn = encryption.connect(str(q), encryption.StoreKey(PASSPHRASE), isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.execute("CREATE TABLE t (x)")
        conn.execute("INSERT INTO t VALUES (?)", ("seed " * 2000,))
        conn.execute("BEGIN")
        conn.execute("UPDATE t SET x = ?", (CANARY * 200,))
        conn.execute("PRAGMA cache_size = 1")  # spill: the journal and the file both written mid-transaction
        conn.execute("INSERT INTO t SELECT x || ? FROM t", (CANARY,))
        assert Path(f"{q}-journal").exists()
        assert CANARY.encode() not in file_bytes(q)
        conn.execute("COMMIT")
    finally:
        conn.close()
    assert CANARY.encode() not in file_bytes(q)


# ------------------------------------------------------------------ refusals


def test_a_wrong_or_missing_key_leaves_the_file_unchanged(tmp_path: Path) -> None:
    p = tmp_path / "s.db"
    with SessionDB(p, key=PASSPHRASE) as db:
        fill(db, 1)
    before = digest(p)
    for attempt in ({"key": WRONG}, {}, {"key": WRONG, "read_only": True}, {"read_only": True}):
        with pytest.raises(errors.EncryptionKeyError) as refused:
            SessionDB(p, **attempt)
        message = str(refused.value)
        assert encryption.KEY_ENV in message and encryption.KEY_FILE_ENV in message and "key=" in message
        assert WRONG not in message and PASSPHRASE not in message
        assert isinstance(refused.value, errors.HermesStoreError)
    for attempt_key in (WRONG, None):
        engine = create_engine(p, key=attempt_key)
        try:
            with pytest.raises((errors.EncryptionKeyError, Exception)):
                with engine.connect() as conn:
                    conn.execute(text("SELECT count(*) FROM sessions")).scalar()
        finally:
            engine.dispose()
    with pytest.raises(errors.EncryptionKeyError):
        migrations.upgrade(create_engine(p, key=WRONG))
    result = run("--db", p, "sessions")
    assert result.code == 1 and encryption.KEY_ENV in result.stderr
    assert digest(p) == before


def test_a_plain_store_opened_with_a_key_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "plain.db"
    with SessionDB(p) as db:
        fill(db, 1)
    before = digest(p)
    with pytest.raises(errors.EncryptionKeyError, match=r"plain \(unencrypted\)"):
        SessionDB(p, key=PASSPHRASE)
    assert digest(p) == before


def test_a_hermes_file_is_never_adopted_into_an_encrypted_store(tmp_path: Path) -> None:
    p = tmp_path / "state.db"
    conn = sqlite3.connect(p)
    conn.executescript("CREATE TABLE schema_version (version INTEGER NOT NULL); INSERT INTO schema_version VALUES (6);"
                       "CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, started_at REAL);")
    conn.close()
    before = digest(p)
    with pytest.raises(errors.EncryptionKeyError):
        SessionDB(p, key=PASSPHRASE)  # a plain file: refused, not adopted and encrypted
    result = run("--db", p, "encrypt", "--key-file", key_file(tmp_path, PASSPHRASE))
    assert result.code == 1 and "adopt" in result.stderr
    assert digest(p) == before


# ------------------------------------------------------------------ the store works whole


def test_search_on_every_route_matches_a_plain_store(tmp_path: Path) -> None:
    plain = SessionDB(tmp_path / "plain.db")
    secret = SessionDB(tmp_path / "secret.db", key=PASSPHRASE)
    try:
        fill(plain)
        fill(secret)
        for query in ("kubernetes", "kubectl",  # word index; Latin inside CJK text (kubectlテキスト)
                      "天安门广场",  # trigram (3+ CJK characters)
                      "北京", "東京",  # short CJK (the bigram route)
                      "rollout", CANARY.split("-")[0]):
            expected = found(plain, query)
            assert expected, query
            assert found(secret, query) == expected, query
        assert secret.get_session_lineage("s2") == plain.get_session_lineage("s2")
        assert secret.get_session_title("s1") == f"{CANARY} title 1"
    finally:
        plain.close()
        secret.close()


def test_hermes_raw_connection_on_an_encrypted_store(tmp_path: Path) -> None:
    """``db._conn`` (Hermes' own plain connection, which its code reaches for) opens the
    encrypted file with the store's key; still a ``sqlite3``-style connection with Row rows."""
    p = tmp_path / "s.db"
    with SessionDB(p, key=PASSPHRASE) as db:
        fill(db, 1)
        row = db._conn.execute("SELECT id, title FROM sessions").fetchone()
        assert (row["id"], row["title"]) == ("s0", f"{CANARY} title 0")
        db._conn.execute("UPDATE sessions SET title = 'renamed' WHERE id = 's0'")
        assert db.get_session_title("s0") == "renamed"
    with SessionDB(p, key=PASSPHRASE, read_only=True) as db:
        assert db._conn.execute("SELECT count(*) FROM messages").fetchone()[0] == len(CORPUS)
    assert CANARY.encode() not in file_bytes(p)


def test_migrations_through_an_engine_a_url_and_alembic(tmp_path: Path) -> None:
    p = tmp_path / "s.db"
    engine = create_engine(p, key=PASSPHRASE)
    try:
        assert migrations.upgrade(engine) == migrations.head()
        assert migrations.current(engine) == migrations.head()
    finally:
        engine.dispose()
    q = tmp_path / "u.db"
    url = f"sqlite://:{PASSPHRASE.replace(' ', '%20')}@/{q}"
    assert migrations.upgrade(url) == migrations.head()
    assert migrations.current(url) == migrations.head()
    assert not held_files.read_prefix(q, 16).startswith(b"SQLite format 3")
    # Alembic's own command line through our env.py, the key in the environment.
    r = tmp_path / "a.db"
    env = dict(os.environ, HERMES_STORE_KEY=PASSPHRASE,
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "alembic", "-x", f"url=sqlite:///{r}", "upgrade", "head"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert PASSPHRASE not in out.stdout + out.stderr
    assert not held_files.read_prefix(r, 16).startswith(b"SQLite format 3")
    assert migrations.current(create_engine(r, key=PASSPHRASE)) == migrations.head()


def test_the_cli_on_an_encrypted_store(tmp_path: Path) -> None:
    p = tmp_path / "s.db"
    kf = key_file(tmp_path, PASSPHRASE)
    ok("--db", p, "demo")
    plain_sessions = ok("--db", p, "--json", "sessions").json()
    plain_search = ok("--db", p, "--json", "search", "kubernetes").json()
    done = ok("--db", p, "encrypt", "--key-file", kf)
    assert "Hermes itself cannot open an encrypted file" in done.stdout
    assert not held_files.read_prefix(p, 16).startswith(b"SQLite format 3")
    env = {encryption.KEY_FILE_ENV: str(kf)}
    assert ok("--db", p, "--json", "sessions", env=env).json() == plain_sessions
    assert ok("--db", p, "--json", "search", "kubernetes", env=env).json() == plain_search
    # Export from the encrypted store, import into another encrypted one.
    exported = tmp_path / "out.jsonl"
    ok("--db", p, "export", "--out", exported, env=env)
    assert CANARY.encode() not in file_bytes(p)
    q = tmp_path / "other.db"
    ok("--db", q, "import", exported, env=env)
    assert ok("--db", q, "--json", "sessions", env=env).json() == plain_sessions
    assert not held_files.read_prefix(q, 16).startswith(b"SQLite format 3")
    # Without the key: a typed, one-line refusal naming what to supply.
    refused = run("--db", p, "--json", "sessions")
    assert refused.code == 1 and json.loads(refused.stderr)["code"] == "encryption_key"
    # rekey, then decrypt: a plain file Hermes can open again.
    new = key_file(tmp_path, RAW_KEY, name="new")
    assert ok("--db", p, "--json", "rekey", "--new-key-file", new, env=env).json()["encrypted"] is True
    assert run("--db", p, "sessions", env=env).code == 1  # the old key no longer opens it
    env_new = {encryption.KEY_FILE_ENV: str(new)}
    assert ok("--db", p, "--json", "sessions", env=env_new).json() == plain_sessions
    ok("--db", p, "decrypt", env=env_new)
    assert held_files.read_prefix(p, 16).startswith(b"SQLite format 3")
    assert ok("--db", p, "--json", "sessions").json() == plain_sessions
    conn = sqlite3.connect(p)  # what Hermes does
    try:
        assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] >= len(plain_sessions["sessions"]) > 0
    finally:
        conn.close()


def test_copy_with_a_key_never_writes_plaintext(tmp_path: Path) -> None:
    """With $HERMES_STORE_KEY set, every file side of a copy given no key of its own is
    opened with it (as for every command): a plain source is refused, one line, and no
    destination is written; naming the destination's key instead encrypts it.
    (Every direction of copy with encrypted files: ``test_encryption_copy.py``.)"""
    plain = tmp_path / "plain.db"
    with SessionDB(plain) as db:
        fill(db)
    env = {encryption.KEY_ENV: PASSPHRASE}
    secret = tmp_path / "secret.db"
    result = run("copy", "--from", plain, "--to", secret, env=env)
    assert result.code == 1 and len(result.stderr.splitlines()) == 1
    assert "plain (unencrypted)" in result.stderr and PASSPHRASE not in result.stderr
    assert not secret.exists()
    ok("copy", "--from", plain, "--to", secret, "--to-key-file", key_file(tmp_path, PASSPHRASE))
    assert CANARY.encode() not in file_bytes(secret)
    with SessionDB(secret, key=PASSPHRASE) as db:
        assert found(db, "kubernetes")


def test_copy_to_a_keyed_url_is_encrypted(tmp_path: Path) -> None:
    plain = tmp_path / "plain.db"
    with SessionDB(plain) as db:
        fill(db, 1)
    secret = tmp_path / "secret.db"
    done = ok("--json", "copy", "--from", plain, "--to", f"sqlite://:{PASSPHRASE.replace(' ', '%20')}@/{secret}")
    assert PASSPHRASE not in done.stdout + done.stderr and "%20" not in done.stdout
    assert secret.exists() and CANARY.encode() not in file_bytes(secret)
    with SessionDB(secret, key=PASSPHRASE, read_only=True) as db:
        assert found(db, "kubernetes")


def _tree(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` and a hash of it (read without dropping SQLite's locks)."""
    return {str(f): hashlib.sha256(held_files.read_prefix(f, f.stat().st_size) if f.stat().st_size else b"")
            .hexdigest() for f in sorted(folder.rglob("*")) if f.is_file()}


def test_the_schema_and_health_commands_on_an_encrypted_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """current, upgrade, adopt, doctor and size read an encrypted store through its key;
    the read-only ones leave every file of its folder byte for byte as it was (no
    sidecar left), and the private copy doctor and ``size --exact`` work on is
    encrypted with the store's key (never a plaintext copy in the temporary folder)."""
    store = tmp_path / "store"
    store.mkdir()
    p = store / "s.db"
    kf = key_file(tmp_path, PASSPHRASE)
    env = {encryption.KEY_FILE_ENV: str(kf)}
    created = ok("--json", "--db", p, "upgrade", env=env).json()
    assert created["created"] and created["revision"] == migrations.head() and created["tables"]["sessions"] == 0
    assert not held_files.read_prefix(p, 16).startswith(b"SQLite format 3")  # encrypted from its first byte
    with SessionDB(p, key=PASSPHRASE) as db:
        fill(db)
    again = ok("--json", "--db", p, "upgrade", env=env).json()
    assert again["previous"] == again["revision"] == migrations.head() and again["tables"]["sessions"] == 3

    # Private copies go to a temporary folder of this test, checked while they exist.
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    copies: list[str] = []
    real_copy = doctor_cli.private_copy

    @contextmanager
    def watched(raw: Any, key: Any = None) -> Iterator[Any]:
        with real_copy(raw, key) as engine:
            made = [f for f in temp.rglob("*") if f.is_file() and f.stat().st_size]
            assert made and all(CANARY.encode() not in held_files.read_prefix(f, f.stat().st_size) for f in made)
            assert all(not held_files.read_prefix(f, 16).startswith(b"SQLite format 3") for f in made)
            copies.append("seen")
            yield engine

    monkeypatch.setattr(doctor_cli, "private_copy", watched)
    monkeypatch.setattr(size_cli, "private_copy", watched)

    before = _tree(store)
    current = ok("--json", "--db", p, "current", env=env).json()
    assert current["revision"] == migrations.head() and current["up_to_date"]
    adopted = ok("--json", "--db", p, "adopt", env=env).json()
    assert adopted["already_adopted"] and adopted["revision"] == migrations.head() and not adopted["adopted"]
    health = ok("--json", "--db", p, "doctor", env=env).json()
    assert health["ok"] and health["integrity"]["ok"] and health["journal_mode"] == "wal"
    assert health["versions"]["driver"]["name"] == encryption.SQLCIPHER_MODULE  # read through SQLCipher
    assert set(health["fts"].values()) == {"ok"}
    space = ok("--json", "--db", p, "size", env=env).json()
    assert space["total_bytes"] == p.stat().st_size and space["search_indexes"]
    exact = ok("--json", "--db", p, "size", "--exact", env=env).json()
    assert exact["reclaim"]["vacuum"]["how"].startswith("exact")
    assert len(copies) == 2  # doctor's FTS check and size --exact, each on an encrypted copy
    assert _tree(store) == before  # byte for byte, and no -wal/-shm left behind
    assert list(temp.iterdir()) == []
    for shown in (json.dumps(health), json.dumps(space), json.dumps(exact)):
        assert PASSPHRASE not in shown

    # Without the key: a typed refusal naming what to supply, for each of them.
    for command in (("current",), ("upgrade",), ("adopt",), ("doctor",), ("size",)):
        refused = run("--json", "--db", p, *command)
        assert refused.code == 1 and json.loads(refused.stderr)["code"] == "encryption_key", (command, refused.stderr)
    # A wrong key: refused the same way, the file unchanged (upgrade writes nothing either).
    wrong = {encryption.KEY_ENV: WRONG}
    for command in (("current",), ("upgrade",), ("adopt",), ("doctor",), ("size",)):
        refused = run("--json", "--db", p, *command, env=wrong)
        assert refused.code == 1 and json.loads(refused.stderr)["code"] == "encryption_key", (command, refused.stderr)
        assert WRONG not in refused.stderr
    assert _tree(store) == before


def test_async_on_an_encrypted_store(tmp_path: Path) -> None:
    p = tmp_path / "s.db"
    with SessionDB(p, key=PASSPHRASE) as db:
        fill(db, 2)

    async def main() -> tuple[Any, ...]:
        async with aio.AsyncSessionDB(p, key=PASSPHRASE) as adb:
            await adb.append_message("s0", role="user", content=f"async {CANARY} 北京")
            hits = await adb.search_messages("北京", limit=100)
        engine = aio.create_async_engine(p, key=PASSPHRASE)
        try:
            async with engine.connect() as conn:
                count = (await conn.execute(text("SELECT count(*) FROM messages"))).scalar()
        finally:
            await engine.dispose()
        wrong = aio.create_async_engine(p, key="wrong")
        try:
            with pytest.raises(errors.EncryptionKeyError):
                async with wrong.connect() as conn:
                    await conn.execute(text("SELECT 1"))
        finally:
            await wrong.dispose()
        return len(hits), count

    hits, count = asyncio.run(main())
    assert hits == 3 and count == 2 * len(CORPUS) + 1
    assert CANARY.encode() not in file_bytes(p)


def test_an_async_store_migrates_an_encrypted_file_off_its_loop(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening ``AsyncSessionDB(path, key=...)`` creates and migrates the encrypted file on
    a worker thread, as for a plain file: the loop's thread never waits on it."""
    threads: list[int] = []
    real = migrations.upgrade

    def recorded(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(migrations, "upgrade", recorded)

    async def main() -> int:
        async with aio.AsyncSessionDB(tmp_path / "new.db", key=PASSPHRASE) as adb:
            await adb.create_session("a", "cli")
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert threads and loop_thread not in threads
    with SessionDB(tmp_path / "new.db", key=PASSPHRASE) as db:
        assert db.get_session("a") is not None


def test_a_plain_program_never_loads_sqlcipher(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "from hermes_store import SessionDB\n"
        f"db = SessionDB({str(tmp_path / 'p.db')!r}); db.create_session('a', source='cli')\n"
        "db.append_message('a', role='user', content='hi'); db.search_messages('hi'); db.close()\n"
        "assert 'sqlcipher3' not in sys.modules, 'sqlcipher3 loaded'\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in (encryption.KEY_ENV, encryption.KEY_FILE_ENV)}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
