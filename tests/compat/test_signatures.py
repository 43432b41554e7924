"""Every method and module-level name of Hermes v23's reference exists, with its exact signature.

The signatures are parsed from the reference itself (a copy lives in
tests/data/reference), so this list cannot drift from the contract: parameter
names, order, kinds (positional / keyword-only) and defaults must match. We may
add parameters only after Hermes' own, keyword-only and defaulted.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "reference" / "SESSIONDB_V23_API.md"
TEXT = REFERENCE.read_text(encoding="utf-8")
#: Hermes v26 re-signed some v23 methods (``delete_session`` gained a positional
#: parameter, ``list_sessions_rich`` moved ``sources`` second); their exact check is
#: tests/compat/test_signatures_v26.py's.
V26_TEXT = (REFERENCE.parent / "SESSIONDB_V26_API.md").read_text(encoding="utf-8")

#: `name(self, ...) -> ret` inside backticks: every SessionDB method signature of the reference.
_METHOD = re.compile(r"`(\w+)\((self(?:[^`]*?))\)(?:\s*->\s*[^`]+)?`")
#: `name(args) -> ret` module-level helpers of §5.
_FUNCTION = re.compile(r"`(\w+)\(([^`]*)\)\s*->\s*[^`]+`")


def _parse(params: str) -> ast.arguments:
    return ast.parse(f"def f({params}): pass").body[0].args  # type: ignore[attr-defined]


def _expected(params: str) -> list[tuple[str, str, object]]:
    """(name, kind, default) per parameter; default ``inspect._empty`` when none."""
    args = _parse(params)
    out: list[tuple[str, str, object]] = []
    positional = args.posonlyargs + args.args
    defaults = [inspect.Parameter.empty] * (len(positional) - len(args.defaults)) + [
        ast.literal_eval(d) for d in args.defaults
    ]
    for a, d in zip(positional, defaults, strict=True):
        out.append((a.arg, "POSITIONAL_OR_KEYWORD", d))
    if args.vararg:
        out.append((args.vararg.arg, "VAR_POSITIONAL", inspect.Parameter.empty))
    for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        out.append((a.arg, "KEYWORD_ONLY", inspect.Parameter.empty if d is None else ast.literal_eval(d)))
    if args.kwarg:
        out.append((args.kwarg.arg, "VAR_KEYWORD", inspect.Parameter.empty))
    return out


def _methods() -> dict[str, str]:
    found: dict[str, str] = {}
    for name, params in _METHOD.findall(TEXT[:TEXT.index("## 3.")]):  # §1-§2: SessionDB itself
        found.setdefault(name, params)
    return found


def _functions() -> dict[str, str]:
    section = TEXT[TEXT.index("## 5."):TEXT.index("## 6.")]
    return {name: params for name, params in _FUNCTION.findall(section) if not name.startswith("__")}


METHODS = _methods()
FUNCTIONS = _functions()
RESIGNED_IN_V26 = {name for name, _params in _METHOD.findall(V26_TEXT)}


def _check(fn, params: str) -> None:
    want = _expected(params)
    got = list(inspect.signature(fn).parameters.values())
    # Hermes' own parameters first, exactly as documented ...
    assert [(p.name, p.kind.name, p.default) for p in got[: len(want)]] == want
    # ... then nothing but defaulted keyword-only extras of ours.
    for extra in got[len(want):]:
        assert extra.kind is inspect.Parameter.KEYWORD_ONLY and extra.default is not inspect.Parameter.empty, extra


def test_the_reference_was_read() -> None:
    assert len(METHODS) >= 75 and "try_acquire_compression_lock" in METHODS
    assert len(FUNCTIONS) >= 20 and "repair_state_db_schema" in FUNCTIONS


@pytest.mark.parametrize("name", sorted(METHODS))
def test_method_has_the_v23_signature(hermes_state, name: str) -> None:
    attr = inspect.getattr_static(hermes_state.SessionDB, name, None)
    assert attr is not None, f"SessionDB.{name} is missing"
    fn = getattr(hermes_state.SessionDB, name)
    if name in RESIGNED_IN_V26:
        assert callable(fn)  # the signature is v26's now (test_signatures_v26.py)
        return
    params = METHODS[name]
    if isinstance(attr, staticmethod):
        params = params.removeprefix("self").lstrip(", ")
    _check(fn, params)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_module_function_has_the_v23_signature(hermes_state, name: str) -> None:
    assert hasattr(hermes_state, name), f"hermes_state.{name} is missing"
    _check(getattr(hermes_state, name), FUNCTIONS[name])


CONSTANTS = [
    "SCHEMA_VERSION", "FTS_STORAGE_VERSION", "MAX_FTS5_QUERY_CHARS", "DEFAULT_DB_PATH", "FTS_CJK_STALE_KEY",
    "SCHEMA_SQL", "DEFERRED_INDEX_SQL", "FTS_SQL", "FTS_TRIGRAM_SQL", "FTS_CJK_TABLE_SQL",
    "FTS_CJK_TRIGGER_SQL", "LEGACY_FTS_SQL", "LEGACY_FTS_TRIGRAM_SQL",
    "AsyncSessionDB", "SessionDB", "get_last_init_error", "format_session_db_unavailable",
    "apply_wal_with_fallback", "_set_last_init_error", "_wal_fallback_warned_paths", "_log_wal_fallback_once",
]


@pytest.mark.parametrize("name", CONSTANTS)
def test_module_name_exists(hermes_state, name: str) -> None:
    assert hasattr(hermes_state, name)


def test_async_wrapper_has_the_v23_signature(hermes_state) -> None:
    _check(hermes_state.AsyncSessionDB.__init__, "self, db")
    _check(hermes_state.AsyncSessionDB.__getattr__, "self, name")


def test_private_names_hermes_code_uses_are_real_class_attributes(hermes_state) -> None:
    # agent/conversation_compression.py: inspect.getattr_static(SessionDB, "try_acquire_compression_lock")
    for name in ("try_acquire_compression_lock", "_execute_write", "_conn", "sanitize_title"):
        assert inspect.getattr_static(hermes_state.SessionDB, name, None) is not None, name
