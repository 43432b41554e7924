"""Hermes' companion modules of ``hermes_state`` (v26's split), one file each.

| module | Hermes' name | holds |
|---|---|---|
| common | hermes_state_common | DDL strings, SCHEMA_VERSION, FTS_* keys, SQL fragments, escape_like |
| schema | hermes_state_schema | SessionSchemaMixin, schema_read_probe_statements |
| search | hermes_state_search | SessionSearchMixin |
| portability | hermes_state_portability | SessionPortabilityMixin |
| provider | hermes_state_provider | SessionDBProvider, get_session_db_provider (v30) |

Each is also reachable as ``hermes_store.hermes_state_<name>`` and, after
:func:`hermes_store.hermes_state.install` (or with the package folder on ``sys.path``),
as the bare ``hermes_state_<name>``: one module object under every name.
"""

#: Hermes' bare module name -> our module (``hermes_store.state_modules.<name>``).
BARE_NAMES = {
    "hermes_state_common": "common",
    "hermes_state_schema": "schema",
    "hermes_state_search": "search",
    "hermes_state_portability": "portability",
    "hermes_state_provider": "provider",
}
