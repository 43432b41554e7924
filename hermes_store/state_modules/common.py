"""Hermes' ``hermes_state_common``: the names its state modules share.

DDL strings (``SCHEMA_SQL``..., built from our migrations on first use),
``SCHEMA_VERSION``, the ``FTS_*`` keys, SQLite SQL-fragment helpers and
``escape_like``. ``hermes_store.hermes_state.install()`` registers this module as
``hermes_state_common``; the facade re-exports every name.
"""

from __future__ import annotations

from typing import Any

from ..hermes_names import (
    DDL_NAMES,
    FTS_CJK_STALE_KEY,
    FTS_STORAGE_VERSION,
    MAX_FTS5_QUERY_CHARS,
    _cwd_prefix_clause,
    _delegate_from_json,
    _ephemeral_child_sql,
    ddl_strings,
)
from ..search.query import escape_like as _escape_like
from ..keys import FTS_STALE_KEY

#: The ``schema_version`` our head revision writes (Hermes v30's file format).
SCHEMA_VERSION = 30
#: Hermes' FTS triggers (word, trigram and CJK-tokenizer indexes): what the fail-open
#: step (``_drop_fts_triggers``) drops and the next writable open makes again.
_FTS_TRIGGERS = tuple(
    f"messages_fts{index}_{event}"
    for index in ("", "_trigram", "_cjk")
    for event in ("insert", "delete", "update")
)


def escape_like(text: str) -> str:
    """``text`` with ``\\``, ``%`` and ``_`` escaped for ``LIKE ? ESCAPE '\\'``."""
    return _escape_like(text)


def __getattr__(name: str) -> Any:
    """Hermes' DDL constants (``SCHEMA_SQL``...), built from our migrations on first use."""
    if name in DDL_NAMES:
        return ddl_strings()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FTS_CJK_STALE_KEY",
    "FTS_STALE_KEY",
    "FTS_STORAGE_VERSION",
    "MAX_FTS5_QUERY_CHARS",
    "SCHEMA_VERSION",
    "_FTS_TRIGGERS",
    "_cwd_prefix_clause",
    "_delegate_from_json",
    "_ephemeral_child_sql",
    "escape_like",
]
