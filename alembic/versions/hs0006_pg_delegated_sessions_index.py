"""PostgreSQL: a small index of the sessions that may be sub-agent transcripts.

Why this revision exists: every search on PostgreSQL asks which sessions carry
Hermes' ``_delegate_from`` marker in ``model_config`` (their rows are held back until
their JSON is read: :mod:`hermes_store.search.delegated`). Without an index that is a
scan of every session on every search: 0.35-0.5 ms of a 10k-message store's 2-4 ms
search, more as sessions accumulate, while a store holds only a handful of such
sessions.

What it does, on PostgreSQL only: a partial index on ``sessions (id)`` whose predicate
is the search's own test, character for character
(:data:`hermes_store.search.delegated.DELEGATED_CANDIDATE`), so the planner proves the
query's condition implies it and reads the few candidates from it (0.01 ms). Writes
pay for it only on sessions carrying the marker. The statement is built on the server
(``current_schema()`` and ``chr(37)`` inside a ``DO`` block): Alembic's offline
``--sql`` mode doubles every ``%`` it writes, and the script must index the schema it
is run in, tenant or default.

The downgrade drops exactly that index.
"""

from alembic import op

from hermes_store.keys import PG_DELEGATED_INDEX

revision = "hs0006"
down_revision = "hs0005"
branch_labels = None
depends_on = None

#: ``model_config LIKE '%\\_delegate\\_from%' ESCAPE '\\'`` with each ``%`` as chr(37).
_CREATE = r"""DO $do$
BEGIN
    EXECUTE 'CREATE INDEX IF NOT EXISTS {index} ON ' || quote_ident(current_schema())
        || '.sessions (id) WHERE model_config LIKE '
        || quote_literal(chr(37) || '\_delegate\_from' || chr(37)) || ' ESCAPE ' || quote_literal('\');
END
$do$"""

_DROP = """DO $do$
BEGIN
    EXECUTE 'DROP INDEX IF EXISTS ' || quote_ident(current_schema()) || '.{index}';
END
$do$"""


def _on_postgresql() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def upgrade() -> None:
    if not _on_postgresql():
        return  # SQLite's search reads the marker with json_extract over its own rows
    op.execute(_CREATE.format(index=PG_DELEGATED_INDEX))


def downgrade() -> None:
    if not _on_postgresql():
        return  # nothing was made on SQLite
    op.execute(_DROP.format(index=PG_DELEGATED_INDEX))
