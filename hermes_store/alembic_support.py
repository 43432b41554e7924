"""Pieces env.py needs to live politely inside SQLite and inside a host application.

* :func:`foreign_names` finds what autogenerate must not touch: FTS5 virtual tables,
  their shadow tables (``_data/_idx/_content/_docsize/_config``), views and SQLite
  internals. None of them is in our metadata, and none is ours to drop.
* For a host application's env.py (README, "Embedding in a host application"):
  :func:`include_name` / :func:`include_object` hide our FTS machinery in branch mode,
  :func:`exclude_hermes_store` hides every object of ours in "ours first" mode,
  :func:`keep_our_keys` (``process_revision_directives``) keeps autogenerate from
  proposing NULL-able primary keys on PostgreSQL, and :func:`quiet_reflection`
  silences SQLite's warnings about our expression indexes. All of them work whatever
  the host's ``target_metadata`` is (one MetaData or a list).
* :func:`upgrade_hermes_store` / :func:`upgrading` are the "ours first" step of a
  host's env.py (README's Way 1 and async recipe): our schema is upgraded only when the
  running Alembic command is ``upgrade``; with ``--sql`` our DDL is written first into
  the same script. ``current``, ``check``, ``revision --autogenerate``, ``stamp`` and
  ``downgrade`` write nothing of ours.
* :func:`next_own_revision_id` / :func:`name_own_revision` give contributor revisions
  ids in our own namespace (``hs0001``, ``hs0002``...), which no Hermes schema
  version (``0001``...``0030``..., digits only) can ever take.
* :func:`keep_triggers_across_batch` repairs the known SQLite batch-mode trap: a
  table rebuild (create ``_alembic_tmp_X`` / copy / drop X / rename) silently drops
  every trigger on X, and the rename fails while a view still names X. env.py installs
  it on every connection it migrates, whoever made it (a host's plain Engine too).
* :func:`sqlite_history_only` is the guard at the top of every revision that replays
  Hermes' SQLite history (0001…0030, hs0001): on PostgreSQL they do nothing and the
  baseline revision ``hs0002`` creates the head schema in one step.
* :data:`PG_SEARCH_COLUMNS` / :data:`PG_SEARCH_INDEXES` / :data:`PG_DELEGATED_INDEX`
  name the PostgreSQL search objects ``hs0002`` and ``hs0006`` make outside the models;
  the ``include_name`` hooks hide them.
"""

from __future__ import annotations

import argparse
import re
import warnings
from contextlib import AbstractContextManager, contextmanager
from typing import Any
from collections.abc import Callable, Iterator, Mapping

from alembic import command
from alembic.runtime.environment import IncludeNameFn, NameFilterParentNames, NameFilterType
from sqlalchemy import Column, Connection, event
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.exc import ResourceClosedError

from . import errors, migrations, paths
from .dialects import for_connection
from .dialects.fts5 import FTS_SHADOWS, HERMES_FTS_TABLES
# PostgreSQL's search machinery (hs0002's raw SQL, in no model), which autogenerate must
# neither drop nor add; named in keys.py so this module loads no PostgreSQL dialect.
from .keys import PG_DELEGATED_INDEX, PG_SEARCH_COLUMNS, PG_SEARCH_INDEXES, VERSION_TABLE
from .models import metadata

SHADOW_SUFFIXES = FTS_SHADOWS  # the dialect's list, named here for hosts' env.py files

#: Every FTS5 virtual table any Hermes schema version (or we) created, and the views
#: that feed them. Listed by name so a host's env.py can hide them without a connection.
FTS_TABLES = HERMES_FTS_TABLES
FTS_VIEWS = ("messages_fts_src", "messages_fts_trigram_src", "messages_fts_cjk_src")
FTS_NAMES = frozenset(
    [*FTS_TABLES, *FTS_VIEWS, *(t + s for t in FTS_TABLES for s in SHADOW_SUFFIXES)]
)

_CREATE_TMP = re.compile(r"^\s*CREATE TABLE\s+[\"`]?_alembic_tmp_(\w+)", re.I)
_RENAME_TMP = re.compile(r"^\s*ALTER TABLE\s+[\"`]?_alembic_tmp_(\w+)[\"`]?\s+RENAME TO", re.I)


def sqlite_history_only(bind: Any) -> bool:
    """True when a revision of Hermes' SQLite history must do nothing (any dialect but SQLite).

    Revisions 0001…0030 and hs0001 reproduce, step by step, the files Hermes itself
    wrote: SQLite DDL, FTS5 tables, triggers and table rebuilds that only mean
    something on SQLite (and whose exact text the adoption and snapshot tests check).
    No PostgreSQL database ever went through that history, so on PostgreSQL they are
    no-ops and one baseline revision (``hs0002``) creates the head schema directly.
    Later revisions are written once for both dialects and need no guard.
    """
    return not for_connection(bind).replays_hermes_history


def foreign_names(conn: Connection) -> set[str]:
    """Names in the file that autogenerate must ignore (FTS, shadows, views, internals)."""
    rows = conn.exec_driver_sql("SELECT type, name, sql FROM sqlite_master").all()
    names: set[str] = set()
    for type_, name, sql in rows:
        if name.startswith("sqlite_") or type_ == "view":
            names.add(name)
        elif type_ == "table" and (sql or "").lstrip().upper().startswith("CREATE VIRTUAL TABLE"):
            names.add(name)
            names.update(name + s for s in SHADOW_SUFFIXES)
    return names


#: Opt-in tables ``SessionDB.apply_telegram_topic_migration()`` creates at run time
#: (never a revision, as in Hermes): autogenerate must neither drop nor add them.
OPT_IN_TABLES = frozenset({"telegram_dm_topic_mode", "telegram_dm_topic_bindings"})


def other_version_tables(
    conn: Connection, version_table: str, skip: set[str] | frozenset[str] = frozenset()
) -> set[str]:
    """Alembic version tables of other applications sharing the database (one column,
    ``version_num``). Our autogenerate must never propose dropping a host's.

    ``skip`` names tables not to look into (FTS machinery: a damaged FTS5 table must
    not stop a migration that could repair it); a table that cannot be read is skipped.
    """
    insp = sa_inspect(conn)
    found: set[str] = set()
    for table in insp.get_table_names():
        if table == version_table or table in skip:
            continue
        try:
            with caught_failure_contained(conn):
                columns = [c["name"] for c in insp.get_columns(table)]
        except Exception:
            continue
        if columns == ["version_num"]:
            found.add(table)
    return found


def caught_failure_contained(conn: Connection) -> AbstractContextManager[Any]:
    """Wrap a statement whose failure the caller catches and carries on from.

    On PostgreSQL a failed statement aborts the whole transaction (every later one
    fails with "current transaction is aborted"), and the transaction may be a host's
    or our migration's: a SAVEPOINT around the statement confines the failure to it.
    SQLite keeps a transaction usable after a failed statement: nothing is needed.
    """
    return for_connection(conn).isolate_failure(conn)


def make_include_name(ignored: set[str], version_table: str) -> IncludeNameFn:
    """``include_name`` hook: reflect only plain tables that are not FTS machinery."""

    def include_name(name: str | None, type_: NameFilterType, parent_names: NameFilterParentNames) -> bool:
        if type_ == "table":
            return name not in ignored and name != version_table and name not in OPT_IN_TABLES
        return not _is_pg_search(name, type_, parent_names)

    return include_name


def _is_pg_search(name: str | None, type_: str, parent_names: Mapping[Any, str | None]) -> bool:
    """One of our PostgreSQL search objects made by raw SQL (hs0002, hs0006), never in
    the models."""
    if type_ == "column":
        return (parent_names.get("table_name"), name) in PG_SEARCH_COLUMNS
    if type_ == "index":
        return name in PG_SEARCH_INDEXES or name == PG_DELEGATED_INDEX
    return False


#: Our own revisions: "hs" + 4 digits. Hermes schema version N is revision "%04d" % N.
OWN_REVISION = re.compile(r"^hs(\d{4})$")
HERMES_REVISION = re.compile(r"^\d{4}$")


def next_own_revision_id(script: Any) -> str:
    """The next free id of our namespace in an Alembic ``ScriptDirectory``."""
    numbers = [int(m.group(1)) for s in script.walk_revisions() if (m := OWN_REVISION.match(s.revision))]
    return f"hs{max(numbers, default=0) + 1:04d}"


def name_own_revision(context: Any, revision: Any, directives: list[Any]) -> None:
    """env.py's ``process_revision_directives``: ``alembic revision`` without ``--rev-id``
    gets :func:`next_own_revision_id` instead of Alembic's random hex.

    An explicit ``--rev-id`` is kept: that is how a maintainer adds the revision of a
    new Hermes schema version (``0031``...).
    """
    cmd_opts = getattr(context.config, "cmd_opts", None)
    if getattr(cmd_opts, "rev_id", None):
        return
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(context.config)
    for directive in directives:
        directive.rev_id = next_own_revision_id(script)


def _nullable_key_columns() -> frozenset[tuple[str, str]]:
    """``(table, column)`` of our key columns the models declare NULL-able.

    Hermes' SQLite DDL lets a non-INTEGER PRIMARY KEY hold NULL (``id TEXT PRIMARY
    KEY``), and the models say so (``nullable=True``) to match its files exactly.
    """
    return frozenset(
        (table.name, column.name)
        for table in metadata.tables.values()
        for column in table.primary_key.columns
        if column.nullable
    )


def keep_our_keys(context: Any, revision: Any, directives: list[Any]) -> None:
    """``process_revision_directives`` for any env.py that compares our models: no
    "change" to the nullability of our primary keys, on either dialect.

    PostgreSQL (like most servers) makes every key column NOT NULL whatever the DDL
    says, so against our NULL-able key columns (see :func:`_nullable_key_columns`)
    autogenerate would propose ``alter_column(..., nullable=True)`` on
    ``sessions.id``, ``state_meta.key``... forever: a change the server refuses
    (``column "id" is in a primary key``) and ``alembic check`` reports. Only that
    difference, on our tables (in the default schema, by name), is dropped: any other
    change to the same column is kept, and so is every change of the host's tables and
    of a key a model makes NOT NULL. Works whatever ``target_metadata`` is (ours, a
    host's, a list of both), for ``revision --autogenerate`` and for ``alembic check``.

    A host with a hook of its own calls this one from it::

        def process_revision_directives(context, revision, directives):
            keep_our_keys(context, revision, directives)
            ...  # the host's own
    """
    from alembic.operations import ops

    ours = _nullable_key_columns()

    def keep(op_: Any) -> bool:
        if not isinstance(op_, ops.AlterColumnOp) or op_.modify_nullable is None:
            return True
        if op_.schema is not None or (op_.table_name, op_.column_name) not in ours:
            return True
        op_.modify_nullable = None
        return op_.has_changes()

    for script in directives:
        for container in (*script.upgrade_ops_list, *script.downgrade_ops_list):
            for table_ops in list(container.ops):
                if isinstance(table_ops, ops.ModifyTableOps):
                    table_ops.ops = [o for o in table_ops.ops if keep(o)]
                    if not table_ops.ops:
                        container.ops.remove(table_ops)


#: The former name of :func:`keep_our_keys` (it now applies on every dialect and to a
#: host's list-valued ``target_metadata``).
drop_sqlite_nullable_keys = keep_our_keys


def revision_directives(context: Any, revision: Any, directives: list[Any]) -> None:
    """env.py's ``process_revision_directives``: the key filter, then our ids."""
    keep_our_keys(context, revision, directives)
    name_own_revision(context, revision, directives)


def _expression_index_names() -> frozenset[str]:
    """Our indexes on an expression (or a DESC column), which SQLite reflection skips."""
    return frozenset(
        index.name
        for table in metadata.tables.values()
        for index in table.indexes
        if index.name and any(not isinstance(e, Column) for e in index.expressions)
    )


@contextmanager
def quiet_reflection() -> Iterator[None]:
    """Silence the warnings about *our* indexes that every autogenerate on SQLite gives.

    SQLAlchemy cannot reflect SQLite expression indexes (Hermes' recency index on
    ``sessions``, v27) and says so (``SAWarning: Skipped unsupported reflection of
    expression-based index ...``), and Alembic then skips comparing them (``UserWarning:
    autogenerate skipping metadata-specified expression-based index ...``). Nothing is
    wrong, and the schema tests compare them. Wrap the ``context.configure`` /
    ``run_migrations`` of an env.py in it; warnings about a host's own indexes still show.
    """
    names = "|".join(re.escape(n) for n in sorted(_expression_index_names()))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=rf".*expression-based index '?(?:{names})\b")
        yield


def _is_machinery(name: str | None) -> bool:
    return name is not None and (name in FTS_NAMES or name.startswith("sqlite_"))


def include_name(name: str | None, type_: str, parent_names: dict[str, Any]) -> bool:
    """Branch mode: a host whose ``target_metadata`` lists our metadata too.

    Hides FTS5 virtual/shadow tables, their views and SQLite internals, our own version
    table, the opt-in Telegram tables, and on PostgreSQL the stored ``tsvector`` column
    and the search indexes (all made by raw SQL, in no metadata, not the host's to
    drop); our plain tables stay visible so autogenerate compares them against
    :data:`hermes_store.models.metadata`. Pair it with :func:`keep_our_keys`.
    """
    if type_ == "table":
        return not _is_machinery(name) and name != VERSION_TABLE and name not in OPT_IN_TABLES
    return not _is_pg_search(name, type_, parent_names)


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Branch mode's ``include_object``: the same objects :func:`include_name` hides
    (FTS5 machinery, SQLite internals, our version table, the opt-in Telegram tables,
    PostgreSQL's search column and indexes), decided on the objects themselves. Use
    either hook, or both; a host's own ``include_object`` can call this one first."""
    if type_ == "column":
        table = getattr(obj, "table", None)
        return include_name(name, type_, {"table_name": getattr(table, "name", None)})
    return include_name(name, type_, {})


def _our_table_names() -> frozenset[str]:
    return frozenset(metadata.tables)


def exclude_hermes_store(name: str | None, type_: str, parent_names: dict[str, Any]) -> bool:
    """"Ours first" mode: the host migrates us by calling ``migrations.upgrade`` and
    its own autogenerate must see none of our objects (plain tables, FTS machinery,
    views, our version table). Indexes and columns of hidden tables go with them."""
    if type_ == "table":
        return not (_is_machinery(name) or name == VERSION_TABLE or name in _our_table_names()
                    or name in OPT_IN_TABLES)
    return True


#: ``-x hermes_store_from=REV`` on a host's ``alembic upgrade FROM:TO --sql``: the revision
#: of ours the database is at (``hermes-store --url URL current`` prints it; ``head``: none).
OFFLINE_FROM_ARGUMENT = "hermes_store_from"


def _running_command() -> tuple[Any, dict[str, Any]]:
    """The EnvironmentContext of the Alembic command running now (or None), and its options."""
    from alembic import context

    proxy = getattr(context, "_proxy", None)
    return proxy, (getattr(proxy, "context_opts", None) or {})


def upgrading() -> bool:
    """Whether the Alembic command running this env.py is ``upgrade`` (online or ``--sql``).

    A host's env.py that migrates us first asks this before touching our schema, so that
    ``alembic current``, ``check``, ``history``, ``revision --autogenerate``, ``stamp`` and
    ``downgrade`` create nothing of ours (they are read-only, or about the host's revisions
    only). Alembic hands env.py the command's per-revision callback; ``upgrade``'s is its
    own function of that name, from the command line and from ``alembic.command`` alike.
    False outside an Alembic run.
    """
    _proxy, opts = _running_command()
    fn = opts.get("fn")
    return getattr(fn, "__name__", "") == "upgrade" and getattr(fn, "__module__", "") == "alembic.command"


def upgrade_hermes_store(url: Any) -> bool:
    """"Ours first" for a host's env.py: bring hermes_store's schema to head before the
    host's revisions run, when (and only when) the Alembic command is ``upgrade``.
    Returns whether it did anything.

    Online: :func:`hermes_store.migrations.upgrade` on ``url`` (our revisions, recorded in
    our own version table, each in its own transaction; a database at head is only read).
    Offline (``alembic upgrade head --sql``): nothing is connected to; our upgrade script
    is written first, into the same output as the host's script, for ``url``'s dialect.
    Alembic's script starts from an empty database, so ours does too; for a
    ``FROM:TO`` range pass the revision of ours the database is at with ``-x
    hermes_store_from=REV`` (``head`` when it is at head): without it an
    :class:`~hermes_store.errors.InvalidInputError` says so, rather than a script that
    would create our tables a second time.

    Every other command (``current``, ``check``, ``revision --autogenerate``, ``stamp``,
    ``downgrade``, ``history``…) leaves our schema as it is and writes nothing.
    """
    if not upgrading():
        return False
    proxy, opts = _running_command()
    if not opts.get("as_sql"):
        migrations.upgrade(url)
        return True
    return _write_our_upgrade_script(proxy, url)


def _write_our_upgrade_script(proxy: Any, url: Any) -> bool:
    """Our offline upgrade, written where the host's ``--sql`` script goes."""
    since = proxy.get_x_argument(as_dictionary=True).get(OFFLINE_FROM_ARGUMENT)
    if since is None and proxy.context_opts.get("starting_rev") not in (None, "base"):
        raise errors.InvalidInputError(
            "this --sql script starts from a revision of yours, not an empty database: say which "
            f"revision of hermes_store's the database is at with -x {OFFLINE_FROM_ARGUMENT}=REV "
            f"('hermes-store --url URL current' prints it; -x {OFFLINE_FROM_ARGUMENT}=head for none of ours)"
        )
    head = paths.head()
    if since in ("head", head):
        return False
    if since is not None and since not in paths.our_revision_ids():
        raise errors.InvalidInputError(f"-x {OFFLINE_FROM_ARGUMENT}={since}: not a revision of hermes_store's")
    rendered = url.render_as_string(hide_password=False) if hasattr(url, "render_as_string") else str(url)
    cfg = paths.make_config(rendered)
    # Our env.py takes the URL from -x url= first (before $HERMES_STORE_URL): the script
    # is for the host's database, whatever the shell says.
    cfg.cmd_opts = argparse.Namespace(x=[f"url={rendered}"])
    cfg.output_buffer = proxy.config.output_buffer
    with paths.alembic_turn(), paths._outer_alembic_kept():
        command.upgrade(cfg, f"{since}:head" if since else "head", sql=True)
    return True


def keep_triggers_across_batch(conn: Connection) -> None:
    """Carry what a batch rebuild of a table would lose, on every rebuild run on ``conn``.

    Alembic's SQLite batch mode rebuilds a table (create ``_alembic_tmp_X`` / copy /
    drop X / rename) from its *reflected* definition, which silently loses:

    * every trigger on X (the FTS sync triggers on ``messages``);
    * ``AUTOINCREMENT``, which SQLAlchemy does not reflect, and with it the
      ``sqlite_sequence`` high-water mark that keeps deleted ids from being reused;
    * the exact index SQL: reflection drops DESC, cuts partial WHERE clauses and
      skips expression indexes, so indexes are re-created from X's own SQL;

    and the final RENAME fails while a view, or a trigger on another table, names X. The hooks park views,
    rewrite the CREATE of the copy to keep AUTOINCREMENT, and restore the rest after
    the rename, so hand-written and autogenerated revisions need no care of their own.
    Our env.py installs them on every connection it migrates (ours, a host's Engine or
    Connection handed to :mod:`hermes_store.migrations`); revisions made from our
    template install them too, so they hold when a host's env.py runs our revisions as
    a branch.

    The hooks belong to ``conn`` (the :class:`~sqlalchemy.Connection` object), not to
    the DB-API connection under it: a pooled DB-API connection outlives the
    Connection that was hooked, and the next Connection checked out over it is hooked
    anew. Statements of their own go through a fresh DB-API cursor (never through
    ``conn``, which would re-enter these events), so they work on any SQLite driver
    SQLAlchemy adapts (pysqlite, aiosqlite).
    """
    if not isinstance(conn, Connection):
        # Offline (``alembic upgrade --sql``): op.get_bind() is Alembic's mock, nothing runs
        # here to hook, and a batch rebuild cannot be rendered without reflection anyway.
        return
    if not for_connection(conn).install_batch_hooks(conn) or _has_batch_hooks(conn):
        return  # already installed on this connection (env.py and a revision may both ask)
    saved: dict[str, tuple[list[str], list[str], int | None]] = {}
    # Index SQL of a table being rebuilt, by name: batch re-creates indexes from their
    # reflection, which loses DESC, cuts partial WHERE clauses and skips expressions.
    original_indexes: dict[str, dict[str, str]] = {}

    def _before(c: Connection, cursor: Any, statement: str, parameters: Any, *_: Any) -> tuple[str, Any]:
        ix = _CREATE_INDEX.match(statement)
        if ix and ix.group(2) in original_indexes and ix.group(1) in original_indexes[ix.group(2)]:
            # Batch re-creating an index it reflected: use the table's own SQL instead.
            return original_indexes[ix.group(2)].pop(ix.group(1)), parameters
        m = _CREATE_TMP.match(statement)
        if not m:
            return statement, parameters
        table = m.group(1)
        q = _raw_query(c)
        original_indexes[table] = dict(
            q("SELECT name, sql FROM sqlite_master WHERE type='index' AND tbl_name=? AND sql IS NOT NULL", (table,))
        )
        original = q("SELECT sql FROM sqlite_master WHERE type='table' AND name=?", (table,))
        triggers = [
            r[0] for r in q("SELECT sql FROM sqlite_master WHERE type='trigger' AND tbl_name=? AND sql IS NOT NULL",
                            (table,))
        ]
        # Triggers on other tables whose body names this one (v29+: the trigram triggers
        # on messages read sessions) would also make the final RENAME fail; park them too.
        names_table = re.compile(rf"\b{re.escape(table)}\b", re.I)
        for name, sql in q(
            "SELECT name, sql FROM sqlite_master WHERE type='trigger' AND tbl_name<>? AND sql IS NOT NULL", (table,)
        ):
            if names_table.search(sql):
                q(f'DROP TRIGGER "{name}"')
                triggers.append(sql)
        views = q("SELECT name, sql FROM sqlite_master WHERE type='view' AND sql IS NOT NULL")
        # A view naming the table would make the final RENAME fail; park it meanwhile.
        for name, _sql in views:
            q(f'DROP VIEW "{name}"')
        seq = None
        if original and _AUTOINCREMENT.search(original[0][0] or ""):
            statement = _with_autoincrement(statement)
            row = q("SELECT seq FROM sqlite_sequence WHERE name=?", (table,))
            seq = row[0][0] if row else None
        saved[table] = (triggers, [sql for _n, sql in views], seq)
        return statement, parameters

    def _after(c: Connection, cursor: Any, statement: str, *_: Any) -> None:
        m = _RENAME_TMP.match(statement)
        if not m or m.group(1) not in saved:
            return
        table = m.group(1)
        q = _raw_query(c)
        triggers, views, seq = saved.pop(table)
        for sql in views:
            q(sql)
        for sql in triggers:
            q(sql)
        # Expression indexes are never reflected, so batch will not re-create them.
        for name, sql in list(original_indexes.get(table, {}).items()):
            if _EXPRESSION_INDEX.search(sql):
                q(sql)
                del original_indexes[table][name]
        if seq is not None:
            # The copy's sequence only reached max(id); ids above it were handed out before.
            q("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = ?", (seq, table))

    _before._hermes_store_batch_hook = True  # type: ignore[attr-defined]
    # retval=True: the before hook may hand back a rewritten CREATE statement.
    event.listen(conn, "before_cursor_execute", _before, retval=True)
    event.listen(conn, "after_cursor_execute", _after)


def _has_batch_hooks(conn: Connection) -> bool:
    """Whether :func:`keep_triggers_across_batch` hooked this Connection already (its
    listener list, which on a Connection includes its Engine's)."""
    return any(getattr(fn, "_hermes_store_batch_hook", False) for fn in conn.dispatch.before_cursor_execute)


def _raw_query(c: Connection) -> Callable[..., list[Any]]:
    """Run SQL on ``c``'s DB-API connection, outside SQLAlchemy's events: a fresh cursor
    per statement, its rows fetched in full (``execute`` may not return the cursor)."""
    dbapi_conn = c.connection.dbapi_connection

    def q(sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        if dbapi_conn is None:  # SQLAlchemy's "closed or invalidated": no cursor to run on
            raise ResourceClosedError("the connection is closed or invalidated")
        cur = dbapi_conn.cursor()
        try:
            cur.execute(sql, params)
            return list(cur.fetchall()) if cur.description else []
        finally:
            cur.close()

    return q


_AUTOINCREMENT = re.compile(r"\bAUTOINCREMENT\b", re.I)
_CREATE_INDEX = re.compile(r"^\s*CREATE\s+(?:UNIQUE\s+)?INDEX\s+[\"`]?(\w+)[\"`]?\s+ON\s+[\"`]?(\w+)", re.I)
#: An index column that is an expression (a function call or parenthesized term).
_EXPRESSION_INDEX = re.compile(r"\bON\s+[\"`]?\w+[\"`]?\s*\((?:[^()]*\()", re.I | re.S)
_TABLE_PK = re.compile(r",\s*PRIMARY KEY \((\w+)\)", re.I)


def _with_autoincrement(create_sql: str) -> str:
    """Turn SQLAlchemy's ``id INTEGER, ... PRIMARY KEY (id)`` into ``id INTEGER PRIMARY KEY AUTOINCREMENT``.

    SQLite accepts AUTOINCREMENT only as a column constraint of an INTEGER PRIMARY KEY.
    Left unchanged when the table-level key is not a single column.
    """
    m = _TABLE_PK.search(create_sql)
    if not m:
        return create_sql
    col = m.group(1)
    column_def = re.compile(rf"(\(\s*|,\s*)({re.escape(col)}|\"{re.escape(col)}\") INTEGER(?=\s*[,)])", re.I)
    if not column_def.search(create_sql):
        return create_sql
    without_pk = create_sql[: m.start()] + create_sql[m.end():]
    return column_def.sub(r"\1\2 INTEGER PRIMARY KEY AUTOINCREMENT", without_pk, count=1)
