"""``copy`` with encrypted SQLite files (issue 34): plain → encrypted, encrypted → plain,
encrypted → encrypted under another key, encrypted ↔ PostgreSQL, each side's key from
its own option (``--from-key-file``/``--to-key-file``, ``source_key=``/``destination_key=``,
a ``sqlite://:<key>@/<path>`` URL) or the environment.

What is shown: the destination is encrypted from its first byte (a canary phrase written
in messages, titles and tool output never appears in any file of its folder: the
database, its ``-wal``/``-journal``, the copy's lock and work files, checked while the
copy runs and after a kill), a work copy of an encrypted source is encrypted too, a
killed copy into an encrypted file resumes exactly, and a wrong or missing key on
either side is :class:`~hermes_store.errors.EncryptionKeyError` with nothing written.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from hermes_store import SessionDB, encryption, errors, held_files, migrations
from hermes_store.adopt.recrypt import recrypt
from hermes_store.copying import copy_history

from .helpers import required_module
from .test_cli import ok, run
from .test_copy import kill_copy
from .test_encryption import CANARY, PASSPHRASE, RAW_KEY, WRONG, digest, file_bytes, fill, found, key_file

required_module("sqlcipher3", "the encryption tests")

OTHER = "another passphrase, for the destination"


def keyed(path: Path, key: str) -> str:
    """A ``sqlite://`` URL carrying ``key`` as its password part."""
    return f"sqlite://:{key.replace(' ', '%20').replace(',', '%2C')}@/{path}"


def every_file(folder: Path, skip: tuple[Path, ...] = ()) -> dict[str, bytes]:
    """Every file below ``folder`` (work folders included), read without dropping SQLite's
    locks; ``skip``: plain files (a plain source) and their sidecars."""
    out: dict[str, bytes] = {}
    skipped = {f"{p}{s}" for p in skip for s in ("", "-wal", "-shm", "-journal")}
    for root, _dirs, names in os.walk(folder):
        for name in names:
            f = Path(root) / name
            if str(f) in skipped or not f.is_file():
                continue
            size = f.stat().st_size
            out[str(f)] = held_files.read_prefix(f, size) if size else b""
    return out


def no_canary(folder: Path, skip: tuple[Path, ...] = ()) -> None:
    leaked = [name for name, data in every_file(folder, skip).items() if CANARY.encode() in data]
    assert leaked == [], f"plaintext on disk in {leaked}"


def is_encrypted(p: Path) -> bool:
    return p.stat().st_size > 0 and not held_files.read_prefix(p, 16).startswith(b"SQLite format 3")


def contents(db: SessionDB) -> list[tuple[Any, ...]]:
    return sorted((m["session_id"], m["role"], m["content"]) for s in db.search_sessions(limit=100)
                  for m in db.get_messages(s["id"]))


def plain_store(p: Path, sessions: int = 3) -> list[tuple[Any, ...]]:
    with SessionDB(p) as db:
        fill(db, sessions)
        return contents(db)


def encrypted_store(p: Path, key: str, sessions: int = 3) -> list[tuple[Any, ...]]:
    with SessionDB(p, key=key) as db:
        fill(db, sessions)
        return contents(db)


def hermes_cannot_read(p: Path) -> None:
    conn = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
    try:
        with pytest.raises(sqlite3.DatabaseError):
            conn.execute("SELECT count(*) FROM sessions").fetchall()
    finally:
        conn.close()


# ------------------------------------------------------------------ the directions


def test_plain_to_encrypted_is_encrypted_from_the_first_byte(tmp_path: Path) -> None:
    src = tmp_path / "plain.db"
    want = plain_store(src)
    out = tmp_path / "out"
    out.mkdir()
    dst = out / "secret.db"
    seen: list[str] = []

    def progress(stage: str, _done: int, _total: int | None) -> None:
        # While the copy writes: every file of the destination's folder (its -wal and
        # -journal, the lock file) holds no plaintext, and the database has no SQLite header.
        if dst.exists() and dst.stat().st_size:
            assert is_encrypted(dst)
        no_canary(out)
        seen.append(stage)

    report = copy_history(src, dst, destination_key=PASSPHRASE, batch=1, progress=progress)
    assert report.ok and "sessions" in seen and report.sessions_copied == 3
    assert is_encrypted(dst) and CANARY.encode() not in file_bytes(dst)
    no_canary(out)
    assert (dst.stat().st_mode & 0o777) == 0o600
    hermes_cannot_read(dst)
    with SessionDB(dst, key=PASSPHRASE) as db:
        assert contents(db) == want
        assert found(db, "kubernetes") and found(db, "北京")
    with pytest.raises(errors.EncryptionKeyError):
        SessionDB(dst, read_only=True)


def test_encrypted_to_plain_and_encrypted_to_encrypted(tmp_path: Path) -> None:
    src = tmp_path / "secret.db"
    want = encrypted_store(src, PASSPHRASE)
    before = digest(src)
    plain = tmp_path / "plain.db"
    assert copy_history(src, plain, source_key=PASSPHRASE).ok
    assert held_files.read_prefix(plain, 16).startswith(b"SQLite format 3")
    conn = sqlite3.connect(plain)  # what Hermes does
    try:
        assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == 3
    finally:
        conn.close()
    with SessionDB(plain) as db:
        assert contents(db) == want
    # Another key for the destination (a raw key here), from a URL's password part.
    other = tmp_path / "other.db"
    report = copy_history(keyed(src, PASSPHRASE), keyed(other, RAW_KEY))
    assert report.ok and PASSPHRASE not in json.dumps(report.as_dict()) and RAW_KEY not in json.dumps(report.as_dict())
    assert is_encrypted(other) and CANARY.encode() not in file_bytes(other)
    with pytest.raises(errors.EncryptionKeyError):
        SessionDB(other, key=PASSPHRASE, read_only=True)
    with SessionDB(other, key=RAW_KEY) as db:
        assert contents(db) == want
    assert digest(src) == before  # the source is only read: its bytes, and no sidecar left
    # Run again: nothing to do, the destination unchanged.
    assert copy_history(src, other, source_key=PASSPHRASE, destination_key=RAW_KEY).already_complete


def test_encrypted_to_postgresql_and_back(tmp_path: Path, pg_database: str) -> None:
    src = tmp_path / "secret.db"
    want = encrypted_store(src, PASSPHRASE)
    before = digest(src)
    assert copy_history(src, pg_database, source_key=PASSPHRASE).ok
    assert digest(src) == before
    with SessionDB(pg_database) as db:
        assert contents(db) == want
        assert found(db, "kubernetes")
    back = tmp_path / "back.db"
    report = copy_history(pg_database, back, destination_key=OTHER)
    assert report.ok and is_encrypted(back)
    no_canary(tmp_path, skip=())  # neither encrypted file, nor anything beside them
    with SessionDB(back, key=OTHER) as db:
        assert contents(db) == want
    # A server side takes no key: refused before anything is opened.
    with pytest.raises(errors.InvalidInputError, match="server"):
        copy_history(src, pg_database, source_key=PASSPHRASE, destination_key=PASSPHRASE)


def test_the_command_line_in_every_direction(tmp_path: Path, pg_database: str) -> None:
    src = tmp_path / "plain.db"
    want = plain_store(src, 2)
    k1, k2 = key_file(tmp_path, PASSPHRASE, name="k1"), key_file(tmp_path, OTHER, name="k2")
    one, two, pg_back, plain = (tmp_path / n for n in ("one.db", "two.db", "pg-back.db", "plain-again.db"))
    ok("copy", "--from", src, "--to", one, "--to-key-file", k1)
    ok("copy", "--from", one, "--from-key-file", k1, "--to", two, "--to-key-file", k2)
    ok("copy", "--from", two, "--from-key-file", k2, "--to", pg_database)
    ok("copy", "--from", pg_database, "--to", pg_back, "--to-key-file", k1)
    done = ok("--json", "--db", pg_back, "copy", "--from-key-file", k1, "--to", plain)  # a plain destination
    assert json.loads(done.stdout)["ok"]
    for p, key in ((one, PASSPHRASE), (two, OTHER), (pg_back, PASSPHRASE)):
        assert is_encrypted(p)
        with SessionDB(p, key=key, read_only=True) as db:
            assert contents(db) == want
    assert not is_encrypted(plain)
    with SessionDB(plain) as db:
        assert contents(db) == want
    no_canary(tmp_path, skip=(src, plain))
    # A keyed sqlite:// URL: the --db store's own key (as for every command), and --to's.
    url_copy = tmp_path / "url.db"
    ok("--url", keyed(one, PASSPHRASE), "copy", "--to", keyed(url_copy, OTHER))
    with SessionDB(url_copy, key=OTHER, read_only=True) as db:
        assert contents(db) == want


def test_the_environment_is_the_key_of_a_side_given_none(tmp_path: Path) -> None:
    """As for every command: a file side without a key of its own is opened with
    $HERMES_STORE_KEY(_FILE)'s; so with a key there, copy never writes a plain file."""
    secret = tmp_path / "secret.db"
    want = encrypted_store(secret, PASSPHRASE, 1)
    env = {encryption.KEY_ENV: PASSPHRASE}
    same = tmp_path / "same-key.db"
    ok("--db", secret, "copy", "--to", same, env=env)
    with SessionDB(same, key=PASSPHRASE, read_only=True) as db:
        assert contents(db) == want
    # --to-key-file names the destination's key; the source keeps the environment's.
    other = tmp_path / "other-key.db"
    ok("copy", "--from", secret, "--to", other, "--to-key-file", key_file(tmp_path, OTHER), env=env)
    with SessionDB(other, key=OTHER, read_only=True) as db:
        assert contents(db) == want
    # A plain side under a key in the environment: refused, one line, nothing written.
    plain = tmp_path / "plain.db"
    plain_store(plain, 1)
    before = digest(plain)
    for args in (("--from", plain, "--to", tmp_path / "new.db"), ("--from", secret, "--to", plain, "--merge")):
        refused = run("--json", "copy", *args, env=env)
        assert refused.code == 1 and json.loads(refused.stderr)["code"] == "encryption_key", refused.stderr
        assert PASSPHRASE not in refused.stderr + refused.stdout
    assert not (tmp_path / "new.db").exists() and digest(plain) == before


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize("side", ["source", "destination"])
@pytest.mark.parametrize("attempt", ["wrong", "missing"])
def test_a_wrong_or_missing_key_on_either_side_writes_nothing(tmp_path: Path, side: str, attempt: str) -> None:
    secret = tmp_path / "secret.db"
    encrypted_store(secret, PASSPHRASE, 1)
    given = WRONG if attempt == "wrong" else None
    if side == "source":
        dst = tmp_path / "out" / "new.db"
        before = digest(secret)
        with pytest.raises(errors.EncryptionKeyError) as refused:
            copy_history(secret, dst, source_key=given, destination_key=OTHER)
        assert not dst.parent.exists()  # not even the destination's folder
        assert digest(secret) == before
        cli = run("copy", "--from", secret, *(("--from-key-file", key_file(tmp_path, WRONG, name="w"))
                                               if given else ()), "--to", dst)
        assert not dst.exists()
    else:
        src = tmp_path / "plain.db"
        plain_store(src, 1)
        before = digest(secret)
        with pytest.raises(errors.EncryptionKeyError) as refused:
            copy_history(src, secret, destination_key=given, merge=True)
        assert digest(secret) == before
        cli = run("copy", "--from", src, "--to", secret, "--merge",
                  *(("--to-key-file", key_file(tmp_path, WRONG, name="w")) if given else ()))
        assert digest(secret) == before
    message = str(refused.value)
    assert WRONG not in message and PASSPHRASE not in message and encryption.KEY_ENV in message
    assert cli.code == 1 and len(cli.stderr.splitlines()) == 1, cli.stderr
    assert "--from-key-file" in cli.stderr and WRONG not in cli.stderr and PASSPHRASE not in cli.stderr
    leftovers = [n for n in os.listdir(tmp_path) if n.startswith(".hermes-store-copy-")]
    assert leftovers == []


def test_a_key_given_twice_differently_or_for_a_server_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "secret.db"
    encrypted_store(src, PASSPHRASE, 1)
    with pytest.raises(errors.InvalidInputError):
        copy_history(keyed(src, PASSPHRASE), tmp_path / "x.db", source_key=OTHER)
    refused = run("copy", "--from", src, "--from-key-file", key_file(tmp_path, PASSPHRASE),
                  "--to", "postgresql+psycopg://u@127.0.0.1:9/db", "--to-key-file", key_file(tmp_path, OTHER, name="o"))
    assert refused.code != 0 and "server" in refused.stderr
    assert not (tmp_path / "x.db").exists()


# ------------------------------------------------------------------ the copy's own safety


@pytest.mark.parametrize("point", [
    pytest.param(("progress", "sessions", 2), id="between-transactions"),
    pytest.param(("insert", None, 7), id="inside-a-message-insert"),
])
def test_a_killed_copy_into_an_encrypted_file_resumes_and_never_leaves_plaintext(
        tmp_path: Path, point: tuple[Any, ...]) -> None:
    src = tmp_path / "plain.db"
    want = plain_store(src, 4)
    out = tmp_path / "out"
    out.mkdir()
    dst = out / "secret.db"
    kill_copy(src, keyed(dst, PASSPHRASE), 2, point)  # SIGKILL, the destination's key in its URL
    assert is_encrypted(dst)
    no_canary(out)  # the database, its -wal and -journal, the lock file: as the kill left them
    report = copy_history(src, dst, destination_key=PASSPHRASE, batch=2)
    assert report.ok and report.resumed and report.sessions_present > 0
    no_canary(out)
    with SessionDB(dst, key=PASSPHRASE) as db:
        assert contents(db) == want


def test_an_encrypted_source_at_an_older_revision_is_read_through_an_encrypted_work_copy(tmp_path: Path) -> None:
    src = tmp_path / "old.db"
    migrations.upgrade(src, "0029")
    conn = sqlite3.connect(src)
    conn.execute("INSERT INTO sessions (id, source, started_at, title) VALUES ('old', 'cli', 1.5, ?)", (CANARY,))
    conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('old', 'user', ?, 2.5)",
                 (f"kept {CANARY} words",))
    conn.commit()
    conn.close()
    recrypt(src, None, encryption.StoreKey(PASSPHRASE))  # what `hermes-store encrypt` does
    assert is_encrypted(src) and CANARY.encode() not in file_bytes(src)
    before = digest(src)
    work = tmp_path / "work"
    work.mkdir()
    looked: list[int] = []

    def progress(stage: str, _done: int, _total: int | None) -> None:
        if stage == "sessions":  # the work copy exists now, upgraded to head
            copies = [p for p in work.rglob("state.db")]
            assert copies and all(is_encrypted(p) for p in copies)
            no_canary(work)
            looked.append(1)

    dst = tmp_path / "new.db"
    report = copy_history(src, dst, source_key=PASSPHRASE, destination_key=OTHER, work_dir=work, progress=progress)
    assert report.ok and report.source_work_copy and report.source_revision == "0029" and looked
    assert list(work.iterdir()) == []
    assert digest(src) == before
    no_canary(tmp_path)
    with SessionDB(dst, key=OTHER) as db:
        assert db.get_session("old")["title"] == CANARY
        assert [h["session_id"] for h in db.search_messages("kept")] == ["old"]
