"""Every SessionDB method signature of Hermes v26's reference, exactly.

Parsed from tests/data/reference/SESSIONDB_V26_API.md itself: each backticked
``name(self, ...)`` and each ``staticmethod `name(...)` `` must exist on
``hermes_state.SessionDB`` with the same parameter names, order, kinds and defaults.
As in the v23 check (test_signatures.py), we may add only keyword-only, defaulted
parameters after Hermes' own.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from .test_signatures import _check, _METHOD

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "reference" / "SESSIONDB_V26_API.md"
TEXT = REFERENCE.read_text(encoding="utf-8")
_STATIC = re.compile(r"staticmethod `(\w+)\(([^`]*)\)(?:\s*->\s*[^`]+)?`")


def _methods() -> dict[str, str]:
    found: dict[str, str] = {}
    for name, params in _METHOD.findall(TEXT):
        found.setdefault(name, params)
    return found


METHODS = _methods()
STATICS = dict(_STATIC.findall(TEXT))


def test_the_reference_was_read() -> None:
    assert len(METHODS) >= 80 and {"__init__", "__exit__", "append_messages_batch", "close"} <= set(METHODS)
    assert {"session_yolo_enabled", "session_gateway_runtime", "session_unread"} <= set(STATICS)
    assert METHODS["__exit__"] == "self, exc_type, exc, tb"


@pytest.mark.parametrize("name", sorted(METHODS))
def test_method_has_the_v26_signature(hermes_state, name: str) -> None:
    attr = inspect.getattr_static(hermes_state.SessionDB, name, None)
    assert attr is not None, f"SessionDB.{name} is missing"
    assert not isinstance(attr, staticmethod), f"SessionDB.{name} must take self"
    _check(getattr(hermes_state.SessionDB, name), METHODS[name])


@pytest.mark.parametrize("name", sorted(STATICS))
def test_staticmethod_has_the_v26_signature(hermes_state, name: str) -> None:
    attr = inspect.getattr_static(hermes_state.SessionDB, name, None)
    assert isinstance(attr, staticmethod), f"SessionDB.{name} is missing or not a staticmethod"
    _check(getattr(hermes_state.SessionDB, name), STATICS[name])
