"""Which tenant schema a statement works in, named in the statement itself.

Behind a transaction pooler (PgBouncer, RDS Proxy, the Supabase/Neon poolers) a
client's consecutive transactions run on different server connections, and a server
connection passes from client to client. Anything a client leaves on a connection
(a session ``SET search_path``, a session advisory lock, a prepared statement) reaches
the next client. So a tenant is never chosen per connection here:

- Core statements built from the models' tables name it through SQLAlchemy's
  ``schema_translate_map`` (set by :func:`tenant_options` on an engine or connection);
- raw SQL that remains (search, catalog and maintenance statements) is written with
  ``{table}`` placeholders and rendered per schema by :class:`SchemaSQL`, which quotes
  the schema and caches the text once per schema.

A leaf module: it imports nothing of the package but :mod:`hermes_store.errors`, so the
engine, the dialect modules and the repositories can all use it without a cycle.
"""

from __future__ import annotations

import re
from typing import Any
from collections.abc import Mapping

from sqlalchemy import Connection, text
from sqlalchemy.engine import URL
from sqlalchemy.sql.elements import TextClause

from . import errors

#: URL query parameter naming one tenant's PostgreSQL schema (``…/db?schema=team_a``).
#: It stays in ``engine.url`` (so an Engine handed on keeps its tenant) and is taken out
#: of the connection parameters before the driver sees them.
SCHEMA_PARAM = "schema"
#: Execution option a Connection carries when it works inside one tenant's schema.
SCHEMA_OPTION = "hermes_store_schema"
#: A plain identifier: never quoted differently, never folded, never a system schema.
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_SYSTEM_SCHEMAS = frozenset({"information_schema"})


def check_schema(name: object) -> str:
    """``name`` when it is a plain schema identifier; InvalidInputError otherwise.

    Checked before any connection is made. Plain means lower-case ASCII letters,
    digits and ``_``, not starting with a digit, at most 63 characters (PostgreSQL's
    limit: a longer name would be cut silently), and not a system schema (``pg_*``,
    ``information_schema``). Such a name needs no quoting rules to be right.
    """
    if (
        not isinstance(name, str)
        or not _SCHEMA_NAME.fullmatch(name)
        or name.startswith("pg_")
        or name in _SYSTEM_SCHEMAS
    ):
        shown = repr(name[:80] if isinstance(name, str) else name)
        shown = shown if len(shown) <= 90 else shown[:87] + "…"
        raise errors.InvalidInputError(
            f"schema name {shown} is not a plain identifier: use 1 to 63 of a-z, 0-9 and _, "
            "not starting with a digit or pg_ (and not information_schema)"
        )
    return name


def schema_in_query(url: URL) -> str | None:
    """The tenant schema a URL's ``?schema=`` names, checked; None when it names none."""
    raw = url.query.get(SCHEMA_PARAM)
    if raw is None:
        return None
    if isinstance(raw, tuple):
        raise errors.InvalidInputError(f"the URL names {len(raw)} schemas; give one ?{SCHEMA_PARAM}=")
    return check_schema(raw)


def quote_ident(name: str) -> str:
    """``name`` as a double-quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def qualified(schema: str | None, name: str) -> str:
    """``"schema"."name"``, or ``name`` alone for the connection's default schema."""
    return name if schema is None else f"{quote_ident(schema)}.{quote_ident(name)}"


def tenant_options(schema: str) -> dict[str, Any]:
    """Execution options that make a connection's statements work in ``schema``."""
    return {"schema_translate_map": {None: schema}, SCHEMA_OPTION: schema}


def schema_of_connection(conn: Connection) -> str | None:
    """The tenant schema ``conn``'s statements work in (None: the default schema).

    Read from the connection's execution options (its own, or its engine's), never from
    the server: ``current_schema()`` answers for whatever the connection was left at.
    """
    return conn.get_execution_options().get(SCHEMA_OPTION)


class _Names(dict[str, str]):
    """``{table}`` placeholders → the table named in one schema (quoted)."""

    def __init__(self, schema: str | None) -> None:
        super().__init__()
        self.schema = schema

    def __missing__(self, key: str) -> str:
        if key == "schema":
            return quote_ident(self.schema) if self.schema is not None else "current_schema()"
        if key == "schema_name":  # the schema as a string literal, for catalog lookups
            return f"'{self.schema}'" if self.schema is not None else "current_schema()"
        return qualified(self.schema, key)


def render(template: str, schema: str | None) -> str:
    """``template`` with each ``{name}`` written as that object in ``schema``.

    ``{schema}`` is the quoted schema itself and ``{schema_name}`` the schema as a
    string (``current_schema()`` for the default schema), for catalog queries. Literal
    braces are written doubled, as in :meth:`str.format`.
    """
    if schema is not None:
        check_schema(schema)
    return template.format_map(_Names(schema))


class SchemaSQL:
    """A raw statement whose objects are written ``{messages}``, ``{state_meta}``…

    Rendered once per schema into a :func:`~sqlalchemy.text` construct (with the bind
    parameters given here), then reused: ``conn.execute(STMT.on(conn), params)``.
    """

    __slots__ = ("_by_schema", "_params", "_values", "template")

    def __init__(self, template: str, *params: Any, **values: Any) -> None:
        """``params``: ``bindparam()`` objects (expanding IN lists, types); ``values``:
        bound values fixed at build time, as for :meth:`TextClause.bindparams`."""
        self.template = template
        self._params = params
        self._values = values
        self._by_schema: dict[str | None, TextClause] = {}

    def for_schema(self, schema: str | None) -> TextClause:
        found = self._by_schema.get(schema)
        if found is None:
            found = text(render(self.template, schema))
            if self._params or self._values:
                found = found.bindparams(*self._params, **self._values)
            self._by_schema[schema] = found
        return found

    def on(self, conn: Connection) -> TextClause:
        """This statement for the schema ``conn`` works in."""
        return self.for_schema(schema_of_connection(conn))


def text_on(conn: Connection, template: str) -> str:
    """``template`` rendered for ``conn``'s schema, as a plain string (for one-off DDL)."""
    return render(template, schema_of_connection(conn))


def as_mapping(schema: str | None) -> Mapping[str, str]:
    """The placeholder mapping itself, for templates assembled piece by piece."""
    return _Names(schema)
