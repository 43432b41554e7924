"""A kill at any step of ``encrypt`` and ``rekey`` leaves the store readable (issue 34).

A subprocess runs the command's work (:func:`hermes_store.adopt.recrypt.recrypt`, what
``hermes-store encrypt``/``rekey`` call) with ``swap.fault_hook`` set to SIGKILL itself
at one named step, as the adoption kill tests do. Afterwards the file opens, with every
row: with the old key (or plain) before the commit point (the rename), with the new
key from it on; the next open tidies up (no marker, no work file left), and the
command run again finishes the job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hermes_store import SessionDB, encryption, errors
from hermes_store.adopt import swap

from .helpers import REPO, required_module

required_module("sqlcipher3", "the encryption tests")

OLD = "old passphrase"
NEW = "x'" + "5a" * 32 + "'"

# argv: path, step, old key ("" for a plain file), new key.
KILL_SCRIPT = r"""
import os, signal, sys
from hermes_store import encryption
from hermes_store.adopt import recrypt, swap
swap.fault_hook = lambda step: os.kill(os.getpid(), signal.SIGKILL) if step == sys.argv[2] else None
old = encryption.StoreKey(sys.argv[3]) if sys.argv[3] else None
recrypt.recrypt(sys.argv[1], old, encryption.StoreKey(sys.argv[4]))
sys.exit(3)  # the step was never reached
"""

#: Every step recrypt announces, in order (recrypt.py's and swap.py's docstrings).
STEPS = ["locked", "exported", "verified", "fsync_work", "fold_wal", "sealed", "fsync_marker", "marker",
         "rename_db", "fsync_dir", "cleanup"]
COMMIT = STEPS.index("rename_db")


@pytest.fixture(autouse=True)
def _no_key_from_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(encryption.KEY_ENV, raising=False)
    monkeypatch.delenv(encryption.KEY_FILE_ENV, raising=False)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (encryption.KEY_ENV, encryption.KEY_FILE_ENV)}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")
    return env


def rows(p: Path, key: str | None) -> list[tuple[str, str]]:
    with SessionDB(p, key=key, read_only=True) as db:
        return sorted((m["session_id"], m["content"]) for s in db.search_sessions(limit=1000)
                      for m in db.get_messages(s["id"]))


def make_store(p: Path, key: str | None) -> list[tuple[str, str]]:
    with SessionDB(p, key=key) as db:
        for n in range(3):
            db.create_session(f"s{n}", source="cli")
            for i in range(20):
                db.append_message(f"s{n}", role="user", content=f"message {i} of s{n} 北京天安门")
    return rows(p, key)


def _leftovers(p: Path) -> list[str]:
    return sorted(n for n in os.listdir(p.parent) if n != p.name and not n.endswith(("-wal", "-shm")))


@pytest.mark.parametrize("command", ["encrypt", "rekey"])
@pytest.mark.parametrize("step", STEPS)
def test_a_kill_at_each_step_leaves_the_store_readable(tmp_path: Path, command: str, step: str) -> None:
    p = tmp_path / "state.db"
    old = OLD if command == "rekey" else None
    expected = make_store(p, old)
    out = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(p), step, old or "", NEW], env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == -signal.SIGKILL, f"step {step} not reached (rc {out.returncode}):\n{out.stderr}"

    swapped = STEPS.index(step) >= COMMIT
    now, other = (NEW, old) if swapped else (old, NEW)
    # Readable, whole, with the key it has now; the other key is refused, nothing changed.
    with pytest.raises(errors.EncryptionKeyError):
        SessionDB(p, key=other, read_only=True)
    assert rows(p, now) == expected
    # The next open (read-write) finishes or rolls back the swap: no marker, no work file.
    with SessionDB(p, key=now) as db:
        db.append_message("s0", role="user", content="after the kill")
    assert _leftovers(p) == [], _leftovers(p)
    # And the command run again (if it had not got there) finishes the job.
    if not swapped:
        recrypt_again = [sys.executable, "-c", KILL_SCRIPT, str(p), "never", old or "", NEW]
        assert subprocess.run(recrypt_again, env=_env(), capture_output=True, timeout=300).returncode == 3
    assert len(rows(p, NEW)) == len(expected) + 1
    assert not swap.marker_path(p).exists()
