"""The one place that knows the SQLite FTS5 dialect.

Statement text only (pure, no database): the dialects run the MATCH queries and the
index commands (:mod:`hermes_store.dialects.fts5`). FTS tables are not in our metadata; they
are reached through these lightweight ``table()`` constructs and raw SQL.
"""

from __future__ import annotations

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
            f"snippet({index}, -1, '{SNIPPET_OPEN}', '{SNIPPET_CLOSE}', '{SNIPPET_ELLIPSIS}', {SNIPPET_TOKENS})"
            " AS snippet, "
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


fts5 = Fts5Backend()
