"""Hermes v25/v26's live-system guard: a test never opens the real ``~/.hermes/state.db``.

Under pytest (or with ``HERMES_TEST_ISOLATION`` set) a SessionDB whose file sits
directly in the real platform state root (``~/.hermes``, resolved from ``$HOME``, not
from ``$HERMES_HOME``), in ``root/profiles/<name>/``, or in one of
``_STATE_DB_GUARD_EXTRA_DENY_ROOTS`` is refused before the file is touched. Test
suites point ``HERMES_HOME`` at temporary folders, which the guard never refuses.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from .patch_points import facade_value

#: Set True (or set the environment variable named below) to switch the guard off.
_STATE_DB_GUARD_BYPASS = False
_STATE_DB_GUARD_BYPASS_ENV = "HERMES_STATE_DB_GUARD_BYPASS"
#: More folders whose direct children are refused in a test context.
_STATE_DB_GUARD_EXTRA_DENY_ROOTS: list[Path] = []

_TEST_ENV = ("PYTEST_CURRENT_TEST", "PYTEST_VERSION", "HERMES_TEST_ISOLATION")
_PYTEST_NAMES = ("pytest", "py.test", "pytest.exe", "py.test.exe")
_ancestry_is_pytest: bool | None = None


def _real_platform_state_root() -> Path:
    """The real ``~/.hermes`` (``%LOCALAPPDATA%\\hermes`` on Windows), resolved."""
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.path.realpath(Path(os.environ["LOCALAPPDATA"], "hermes")))
    return Path(os.path.realpath(Path(os.path.expanduser("~"), ".hermes")))


def _running_under_pytest() -> bool:
    return any(os.environ.get(name) for name in _TEST_ENV)


def _process_looks_like_pytest(proc: Any) -> bool:
    """A token of ``proc.cmdline()`` names pytest; an unreadable command line is no."""
    try:
        tokens = proc.cmdline()
    except Exception:
        return False
    return any(os.path.basename(str(t)).lower() in _PYTEST_NAMES for t in tokens or ())


def _in_test_context() -> bool:
    """The environment says pytest, or (with psutil) an ancestor process is pytest (memoized)."""
    global _ancestry_is_pytest
    if _running_under_pytest():
        return True
    if _ancestry_is_pytest is None:
        psutil = facade_value("psutil", None)
        found = False
        if psutil is not None:
            try:
                proc = psutil.Process()
                for each in [proc, *proc.parents()]:
                    if _process_looks_like_pytest(each):
                        found = True
                        break
            except Exception:
                found = False
        _ancestry_is_pytest = found
    return _ancestry_is_pytest


def _ensure_test_isolation(db_path: Any) -> None:
    """Refuse, in a test context, a database file in the real Hermes state root."""
    if facade_value("_STATE_DB_GUARD_BYPASS", _STATE_DB_GUARD_BYPASS):
        return
    bypass_env = facade_value("_STATE_DB_GUARD_BYPASS_ENV", _STATE_DB_GUARD_BYPASS_ENV)
    if os.environ.get(bypass_env):
        return
    if db_path is None or not _in_test_context():
        return
    path = Path(os.path.realpath(Path(os.fspath(db_path)).expanduser()))
    root = _real_platform_state_root()
    extra = facade_value("_STATE_DB_GUARD_EXTRA_DENY_ROOTS", _STATE_DB_GUARD_EXTRA_DENY_ROOTS)
    denied = [root, *(Path(os.path.realpath(Path(os.fspath(r)).expanduser())) for r in extra)]
    parent = path.parent
    in_profile = parent.parent.parent == root and parent.parent.name == "profiles"
    if parent in denied or in_profile:
        raise RuntimeError(
            f"live-system guard: a test tried to open {path}, the real Hermes state; point "
            f"HERMES_HOME at a temporary folder (or set {bypass_env}=1)"
        )
