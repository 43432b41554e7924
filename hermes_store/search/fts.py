"""The one place that knows the SQLite FTS5 dialect.

Repositories ask this backend for MATCH queries, snippets and index maintenance
instead of scattering FTS5 syntax around. FTS tables are not in our metadata; they
are reached through these lightweight ``table()`` constructs and raw SQL.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import column, table

WORD_INDEX = "messages_fts"
TRIGRAM_INDEX = "messages_fts_trigram"
TRIGRAM_SOURCE_VIEW = "messages_fts_trigram_src"
WORD_SOURCE_VIEW = "messages_fts_src"
FTS_INDEXES = (WORD_INDEX, TRIGRAM_INDEX)

#: Sessions whose messages Hermes keeps out of the trigram index, by schema version,
#: as a condition on ``sessions`` aliased ``s`` (true = the session is indexed).
#: v30 (PR #102032): cron and sub-agent transcripts, by source or by the
#: ``_delegate_from`` marker (a malformed model_config counts as no marker).
TRIGRAM_SESSIONS_V30 = (
    "s.source NOT IN ('cron', 'subagent') AND json_extract((CASE WHEN json_valid(s.model_config) "
    "THEN s.model_config ELSE json_object() END), '$._delegate_from') IS NULL"
)
#: v29 (PR #101725): cron sessions only.
TRIGRAM_SESSIONS_V29 = "s.source <> 'cron'"

#: Light constructs for queries that want them (not part of any MetaData).
messages_fts = table(WORD_INDEX, column("rowid"), column("content"), column("tool_name"), column("tool_calls"))
# From v30 (FTS layout 2) the trigram index has no tool_calls column.
messages_fts_trigram = table(TRIGRAM_INDEX, column("rowid"), column("content"), column("tool_name"))



def trigram_sessions(view_sql: str) -> str:
    """The session condition of the trigram index whose source view is ``view_sql``.

    Read from the view the file really has, so every search route leaves out exactly
    the sessions its trigram index leaves out: none before v29 (the view does not
    join ``sessions``), cron at v29, cron and sub-agents from v30. Returns '' when no
    session is left out.
    """
    if "_delegate_from" in view_sql:
        return TRIGRAM_SESSIONS_V30
    if "cron" in view_sql:
        return TRIGRAM_SESSIONS_V29
    return ""


SNIPPET_OPEN, SNIPPET_CLOSE, SNIPPET_ELLIPSIS = ">>>", "<<<", "..."
SNIPPET_TOKENS = 10
#: Pages of work one bounded 'merge' does at most (about 2 MB of index written): the
#: periodic upkeep after every 1,000 writes, which must not hold the write lock long.
MERGE_PAGES = 500


class Fts5Backend:
    """FTS5 statements for the two message indexes."""

    def match_sql(self, index: str) -> str:
        """Hits of ``:q`` in ``index`` with a best-column snippet and a bm25 rank."""
        return (
            f"SELECT {index}.rowid AS id, "
            f"snippet({index}, -1, '{SNIPPET_OPEN}', '{SNIPPET_CLOSE}', '{SNIPPET_ELLIPSIS}', {SNIPPET_TOKENS}) AS snippet, "
            f"bm25({index}) AS rank "
            f"FROM {index} WHERE {index} MATCH :q"
        )

    def top_sql(self, index: str) -> str:
        """The ``:window`` best-ranked hits for ``:q``, with snippets.

        Ordering by FTS5's own ``rank`` column lets FTS5 sort internally, so the
        snippet is built only for the rows returned (a ``bm25()`` alias would make
        SQLite sort, and snippet every match first).
        """
        return (
            f"SELECT rowid, rank, snippet({index}, -1, '{SNIPPET_OPEN}', '{SNIPPET_CLOSE}', '{SNIPPET_ELLIPSIS}', "
            f"{SNIPPET_TOKENS}) FROM {index} WHERE {index} MATCH :q ORDER BY rank LIMIT :window"
        )

    def command(self, conn: Any, index: str, cmd: str) -> None:
        """Run an FTS5 special command ('rebuild', 'optimize', 'merge', 'integrity-check')."""
        if cmd == "integrity-check":
            # rank=1 also compares the index with its external content.
            conn.exec_driver_sql(f"INSERT INTO {index}({index}, rank) VALUES('integrity-check', 1)")
        elif cmd == "merge":
            # Bounded upkeep: at most about MERGE_PAGES pages of segment merging, and
            # only where automerge left a level with enough segments (positive N).
            conn.exec_driver_sql(f"INSERT INTO {index}({index}, rank) VALUES('merge', {MERGE_PAGES})")
        else:
            conn.exec_driver_sql(f"INSERT INTO {index}({index}) VALUES('{cmd}')")

    def existing_indexes(self, conn: Any) -> list[str]:
        names = {
            r[0]
            for r in conn.exec_driver_sql(
                "SELECT name FROM sqlite_master WHERE type='table' AND sql LIKE 'CREATE VIRTUAL TABLE%'"
            )
        }
        return [i for i in FTS_INDEXES if i in names]


fts5 = Fts5Backend()
