"""Lineage through ``parent_session_id``: every answer is one recursive CTE.

Chains are walked in SQL, never with a Python loop of queries. Each walk carries a
depth bound (cycle-safe: a corrupt cycle stops at the bound instead of spinning).
"""

from __future__ import annotations

from typing import Any, Sequence

from sqlalchemy import bindparam, text

from .base import Repository

#: The one bound of every walk through ``parent_session_id`` (ancestors, descendants
#: and compression chains, here, in listings and in the CLI). It only exists so a
#: corrupt cycle stops instead of spinning; it must never cut a real chain. Compression
#: walks used 1,000 in listings and 10,000 here: the larger one is kept, since a
#: long-running agent can compress more than 1,000 times, and a cycle costs at most
#: 10,000 small rows per walk.
MAX_DEPTH = 10_000

#: A child continues its parent's compression chain when the parent ended with
#: 'compression' and the child started at or after that end.
_CONTINUES = (
    "p.end_reason = 'compression' AND p.ended_at IS NOT NULL AND c.started_at >= p.ended_at"
)


_ANCESTORS = text(
    "WITH RECURSIVE up(id, parent, depth) AS ("
    " SELECT id, parent_session_id, 0 FROM sessions WHERE id = :sid"
    " UNION ALL"
    " SELECT s.id, s.parent_session_id, up.depth + 1 FROM sessions s JOIN up ON s.id = up.parent"
    " WHERE up.depth < :max)"
    " SELECT id, min(depth) AS d FROM up GROUP BY id ORDER BY d DESC"
)
_DESCENDANTS = text(
    "WITH RECURSIVE down(id, depth) AS ("
    " SELECT id, 0 FROM sessions WHERE id = :sid"
    " UNION ALL"
    " SELECT s.id, down.depth + 1 FROM sessions s JOIN down ON s.parent_session_id = down.id"
    " WHERE down.depth < :max)"
    " SELECT d.id FROM (SELECT id, min(depth) AS depth FROM down GROUP BY id) d"
    " JOIN sessions s ON s.id = d.id WHERE d.depth > 0 ORDER BY d.depth, s.started_at, s.id"
)


class LineageRepository(Repository):
    def ancestors(self, session_id: str, *, include_self: bool = True) -> list[str]:
        """Root first, ending with the session itself (or its parent)."""
        rows = self.conn.execute(_ANCESTORS, {"sid": session_id, "max": MAX_DEPTH}).fetchall()
        ids = [r[0] for r in rows]
        return ids if include_self else ids[:-1]

    def descendants(self, session_id: str) -> list[str]:
        """Every session below this one (breadth order: depth, then start time)."""
        rows = self.conn.execute(_DESCENDANTS, {"sid": session_id, "max": MAX_DEPTH}).fetchall()
        return [r[0] for r in rows]

    def _continuations_sql(self, select: str) -> Any:
        return text(f"WITH RECURSIVE {compression_chain_cte(':sid')} " + select)

    def compression_tip(self, session_id: str) -> str | None:
        """The newest session of the compression chain starting at ``session_id``."""
        row = self.conn.execute(
            self._continuations_sql(
                "SELECT chain.id FROM chain JOIN sessions s ON s.id = chain.id"
                " ORDER BY chain.depth DESC, s.started_at DESC, chain.id DESC LIMIT 1"
            ),
            {"sid": session_id},
        ).first()
        return row[0] if row else None

    def resume_target(self, session_id: str) -> str:
        """The newest continuation that actually holds messages, else the session itself."""
        row = self.conn.execute(
            self._continuations_sql(
                "SELECT chain.id FROM chain JOIN sessions s ON s.id = chain.id"
                " WHERE EXISTS (SELECT 1 FROM messages m WHERE m.session_id = chain.id)"
                " ORDER BY chain.depth DESC, s.started_at DESC, chain.id DESC LIMIT 1"
            ),
            {"sid": session_id},
        ).first()
        return row[0] if row else session_id

    def chain(self, session_id: str) -> list[str]:
        """Root → ... → session → ... → compression tip, in one statement."""
        rows = self.conn.execute(text(
            "WITH RECURSIVE up(id, parent, depth) AS ("
            " SELECT id, parent_session_id, 0 FROM sessions WHERE id = :sid"
            " UNION ALL SELECT s.id, s.parent_session_id, up.depth + 1 FROM sessions s JOIN up ON s.id = up.parent"
            " WHERE up.depth < :max),"
            f" {compression_chain_cte(':sid')},"
            " tip AS (SELECT chain.id, chain.depth FROM chain JOIN sessions s ON s.id = chain.id"
            " ORDER BY chain.depth DESC, s.started_at DESC LIMIT 1),"
            " down(id, depth) AS ("
            # walk back up from the tip to the session: the single path between them
            " SELECT id, depth FROM tip"
            " UNION ALL SELECT s.parent_session_id, down.depth - 1 FROM down JOIN sessions s ON s.id = down.id"
            " WHERE down.depth > 1)"
            " SELECT id, -min(depth) AS k FROM up GROUP BY id"
            " UNION ALL SELECT id, depth FROM down WHERE depth > 0"
            " ORDER BY k"),
            {"sid": session_id, "max": MAX_DEPTH},
        ).fetchall()
        return [r[0] for r in rows]

    def compression_tips(self, ids: Sequence[str]) -> dict[str, str]:
        """``{tip: root}`` for the given sessions that are the newest step of a compression chain.

        A tip continues a compressed parent and nothing continues it in turn; its root
        is the first session of its chain. One statement, depth-bounded like every walk.
        """
        if not ids:
            return {}
        rows = self.conn.execute(
            text(
                "WITH RECURSIVE up(start, id, depth) AS ("
                " SELECT id, id, 0 FROM sessions WHERE id IN :ids"
                " UNION ALL SELECT up.start, p.id, up.depth + 1 FROM up JOIN sessions c ON c.id = up.id"
                f" JOIN sessions p ON p.id = c.parent_session_id WHERE {_CONTINUES} AND up.depth < {MAX_DEPTH})"
                " SELECT u.start, u.id FROM up u WHERE u.depth > 0"
                " AND u.depth = (SELECT max(v.depth) FROM up v WHERE v.start = u.start)"
            ).bindparams(bindparam("ids", expanding=True)),
            {"ids": list(ids)},
        ).fetchall()
        tips = {start: root for start, root in rows}
        if tips:
            continued = self.conn.execute(
                text(
                    "SELECT DISTINCT p.id FROM sessions p JOIN sessions c ON c.parent_session_id = p.id"
                    f" WHERE p.id IN :ids AND {_CONTINUES}"
                ).bindparams(bindparam("ids", expanding=True)),
                {"ids": list(tips)},
            ).fetchall()
            for (sid,) in continued:
                tips.pop(sid, None)
        return tips


def compression_chain_cte(seed: str) -> str:
    """THE compression-chain walk: ``chain(id, depth)`` from the session bound as ``seed``
    down through every continuation (see _CONTINUES), bounded by MAX_DEPTH."""
    return (
        "chain(id, depth) AS ("
        f" SELECT id, 0 FROM sessions WHERE id = {seed}"
        " UNION ALL SELECT c.id, chain.depth + 1 FROM chain JOIN sessions p ON p.id = chain.id"
        f" JOIN sessions c ON c.parent_session_id = p.id WHERE {_CONTINUES} AND chain.depth < {MAX_DEPTH})"
    )
