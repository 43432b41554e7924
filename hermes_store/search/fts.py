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
FTS_INDEXES = (WORD_INDEX, TRIGRAM_INDEX)

#: Light constructs for queries that want them (not part of any MetaData).
messages_fts = table(WORD_INDEX, column("rowid"), column("content"), column("tool_name"), column("tool_calls"))
messages_fts_trigram = table(
    TRIGRAM_INDEX, column("rowid"), column("content"), column("tool_name"), column("tool_calls")
)

SNIPPET_OPEN, SNIPPET_CLOSE, SNIPPET_ELLIPSIS = ">>>", "<<<", "..."
SNIPPET_TOKENS = 10


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
        """Run an FTS5 special command ('rebuild', 'optimize', 'integrity-check')."""
        if cmd == "integrity-check":
            # rank=1 also compares the index with its external content.
            conn.exec_driver_sql(f"INSERT INTO {index}({index}, rank) VALUES('integrity-check', 1)")
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
