"""Lineage through ``parent_session_id``: one statement per question, SQLAlchemy Core.

Two kinds of walk:

* plain parent links (ancestors, descendants, the conversation root): recursive CTEs
  that return the answer directly, depth-bounded so a corrupt cycle stops;
* Hermes' compression walks (tip, resume target, compression lineage, the CLI's tip
  marker): one recursive CTE fetches the small subgraph the walk can reach, and the
  per-step choice is made here in Python. The choice depends on lineage markers inside
  the ``model_config`` JSON (``_branched_from``, ``_delegate_from``), which PostgreSQL
  cannot test safely in SQL when a row holds malformed JSON; parsing them here gives
  both backends the same answer with no dialect code, and the walk keeps Hermes'
  exact per-step preference order and cycle rule.

The forward compression edge (Hermes v23): parent ``end_reason='compression'`` →
child without ``_branched_from``, without ``_delegate_from`` and ``source != 'tool'``.
Unlike v11 there is no ``child.started_at >= parent.ended_at`` condition.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Sequence

from sqlalchemy import (
    Boolean,
    Float,
    Integer,
    String,
    cast,
    exists,
    func,
    literal_column,
    null,
    or_,
    select,
)
from sqlalchemy.sql import Select
from sqlalchemy.sql.selectable import CTE

from .base import MESSAGES, SESSIONS, Repository

#: The one bound of every walk through ``parent_session_id`` (ancestors, descendants
#: and compression chains, here, in listings and in the CLI). It only exists so a
#: corrupt cycle stops instead of spinning; it must never cut a real chain. Hermes v23
#: stops its compression and root walks after 100 hops; a long-running agent can
#: compress more often than that, so we keep the larger bound (a deliberate
#: difference: a chain deeper than 100 resumes at its real tip, not mid-chain).
MAX_DEPTH = 10_000

#: Hermes' bound on the resume walk below the compression tip (most recent child first).
RESUME_HOPS = 32

COMPRESSION = "compression"
BRANCH_MARKER = "_branched_from"
DELEGATE_MARKER = "_delegate_from"

_S = SESSIONS
_M = MESSAGES
_ZERO = literal_column("0", Integer)
_ONE = literal_column("1", Integer)


# --------------------------------------------------------------------- plain parent links


def _up(session_id: str) -> CTE:
    """``up(id, parent, depth)``: the session and every parent above it, depth-bounded."""
    seed = select(_S.c.id, _S.c.parent_session_id.label("parent"), _ZERO.label("depth")).where(_S.c.id == session_id)
    up = seed.cte("up", recursive=True)
    step = (
        select(_S.c.id, _S.c.parent_session_id, up.c.depth + _ONE)
        .join_from(_S, up, _S.c.id == up.c.parent)
        .where(up.c.depth < MAX_DEPTH)
    )
    return up.union_all(step)


def _ancestors_stmt(session_id: str) -> Select:
    up = _up(session_id)
    depth = func.min(up.c.depth).label("d")
    return select(up.c.id, depth).group_by(up.c.id).order_by(depth.desc())


def _descendants_stmt(session_id: str) -> Select:
    seed = select(_S.c.id, _ZERO.label("depth")).where(_S.c.id == session_id)
    down = seed.cte("down", recursive=True)
    step = (
        select(_S.c.id, down.c.depth + _ONE)
        .join_from(_S, down, _S.c.parent_session_id == down.c.id)
        .where(down.c.depth < MAX_DEPTH)
    )
    down = down.union_all(step)
    first = select(down.c.id, func.min(down.c.depth).label("depth")).group_by(down.c.id).subquery("d")
    return (
        select(first.c.id)
        .join_from(first, _S, _S.c.id == first.c.id)
        .where(first.c.depth > 0)
        .order_by(first.c.depth, _S.c.started_at, _S.c.id)
    )


# --------------------------------------------------------------------- compression subgraphs


def _forward(seed: Select, name: str = "fwd", *, skip_tool: bool = True) -> CTE:
    """``fwd(id, end_reason)``: the seed rows, then every child of a member that ended
    'compression' (tool children left out unless ``skip_tool`` is False).

    UNION, not UNION ALL: each session appears once, so a cycle ends the recursion by
    itself. Marker children are kept: only Python can read their markers safely.
    """
    fwd = seed.cte(name, recursive=True)
    child = _S.alias(f"{name}_c")
    cond = [fwd.c.end_reason == COMPRESSION]
    if skip_tool:
        cond.append(child.c.source != "tool")
    step = select(child.c.id, child.c.end_reason).join_from(fwd, child, child.c.parent_session_id == fwd.c.id).where(*cond)
    return fwd.union(step)


def _seed(ids: Select | Sequence[str] | str) -> Select:
    if isinstance(ids, str):
        where = _S.c.id == ids
    else:
        where = _S.c.id.in_(ids)
    return select(_S.c.id, _S.c.end_reason).where(where)


def _climb(ids: Sequence[str], *, skip_tool: bool) -> CTE:
    """``climb(id, parent, source)``: the sessions and each parent that ended 'compression'
    above them (through non-tool children when ``skip_tool``). UNION: cycle-safe."""
    seed = select(_S.c.id, _S.c.parent_session_id.label("parent"), _S.c.source).where(_S.c.id.in_(list(ids)))
    climb = seed.cte("climb", recursive=True)
    parent = _S.alias("climb_p")
    cond = [parent.c.end_reason == COMPRESSION]
    if skip_tool:
        cond.append(climb.c.source != "tool")
    step = (
        select(parent.c.id, parent.c.parent_session_id, parent.c.source)
        .join_from(climb, parent, parent.c.id == climb.c.parent)
        .where(*cond)
    )
    return climb.union(step)


def _node_columns(kind: str) -> list[Any]:
    """What a walk needs of each session: links, end state, markers, latest activity."""
    return [
        literal_column(f"'{kind}'", String).label("kind"),
        _S.c.id,
        _S.c.parent_session_id,
        _S.c.source,
        _S.c.started_at,
        _S.c.ended_at,
        _S.c.end_reason,
        _S.c.model_config,
        select(func.max(_M.c.timestamp)).where(_M.c.session_id == _S.c.id).scalar_subquery().label("activity"),
        exists().where(_M.c.session_id == _S.c.id).label("has_messages"),
    ]


def _nodes(ids_select: Select, kind: str = "node") -> Select:
    return select(*_node_columns(kind)).where(_S.c.id.in_(ids_select))


# --------------------------------------------------------------------- the walks (Python side)


def _marker(model_config: Any, key: str) -> bool:
    """Whether the JSON object in ``model_config`` names ``key`` (JSON null does not count).

    Same test as SQLite's ``json_extract(model_config, '$.key') IS NOT NULL`` on valid
    JSON; malformed JSON or a non-object counts as no marker.
    """
    if not model_config or not isinstance(model_config, str) or key not in model_config:
        return False
    try:
        value = json.loads(model_config)
    except ValueError:
        return False
    return isinstance(value, dict) and value.get(key) is not None


def _num(value: Any) -> float:
    """A sortable number for a REAL column (NULL or junk sorts lowest)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("-inf")


class Node:
    """One fetched session: links, end state, lineage markers, latest activity."""

    __slots__ = ("id", "parent", "source", "started_at", "ended_at", "end_reason", "activity", "has_messages",
                 "branched", "delegated", "children")

    def __init__(self, sid: str, parent: str | None, source: str | None, started_at: Any, ended_at: Any,
                 end_reason: str | None, model_config: Any, activity: Any, has_messages: Any) -> None:
        self.id = sid
        self.parent = parent
        self.source = source
        self.started_at = started_at
        self.ended_at = ended_at
        self.end_reason = end_reason
        self.activity = activity
        self.has_messages = bool(has_messages)
        self.branched = _marker(model_config, BRANCH_MARKER)
        self.delegated = _marker(model_config, DELEGATE_MARKER)
        self.children: list[Node] = []

    @property
    def compressed(self) -> bool:
        return self.end_reason == COMPRESSION

    def _walkable(self) -> list["Node"]:
        return [c for c in self.children if c.source != "tool" and not c.branched and not c.delegated]

    def continues_as(self) -> "Node | None":
        """The preferred forward compression child (Hermes v23 per-step order).

        Children that ended 'compression' first, then live ones, then the rest; ties by
        latest activity (newest message, else start), then start, then id, newest first.
        """
        if not self.compressed:
            return None
        kids = self._walkable()
        if not kids:
            return None
        if len(kids) == 1:
            return kids[0]

        def rank(c: Node) -> tuple[int, float, float, str]:
            tier = 0 if c.compressed else (1 if c.ended_at is None else 2)
            active = c.activity if c.activity is not None else c.started_at
            return (-tier, _num(active), _num(c.started_at), c.id)

        return max(kids, key=rank)

    def newest_child(self) -> "Node | None":
        """The most recently started child that is neither a branch, a delegate nor a tool run."""
        kids = self._walkable()
        return max(kids, key=lambda c: (_num(c.started_at), c.id)) if kids else None

    def first_non_branch_child(self) -> "Node | None":
        """The earliest-started child that is not a branch (delegates and tool runs count)."""
        kids = [c for c in self.children if not c.branched]
        return min(kids, key=lambda c: (_num(c.started_at), c.id)) if kids else None


class Graph:
    """The fetched sessions (rows shaped like :func:`_node_columns`), linked parent → children."""

    def __init__(self, rows: Iterable[Any]) -> None:
        self.nodes: dict[str, Node] = {}
        for _kind, sid, *fields in rows:
            if sid not in self.nodes:
                self.nodes[sid] = Node(sid, *fields)
        nodes = self.nodes
        for node in nodes.values():
            parent = nodes.get(node.parent) if node.parent is not None else None
            if parent is not None:
                parent.children.append(node)

    def get(self, session_id: str) -> Node | None:
        return self.nodes.get(session_id)

    def tip(self, session_id: str) -> str:
        """Where the forward walk from the session ends (the id itself when unknown)."""
        path = self.forward_path(session_id)
        return path[-1] if path else session_id

    def forward_path(self, session_id: str) -> list[str]:
        """The session, then each preferred forward compression step, until none is left or
        the next one would revisit a session (a corrupt cycle)."""
        node = self.nodes.get(session_id)
        if node is None:
            return []
        path = [node.id]
        seen = {node.id}
        for _ in range(MAX_DEPTH):
            nxt = node.continues_as()
            if nxt is None or nxt.id in seen:
                break
            node = nxt
            seen.add(node.id)
            path.append(node.id)
        return path

    def compression_root(self, session_id: str) -> str:
        """Climb while the session is a forward compression child of its parent."""
        node = self.nodes[session_id]
        seen = {node.id}
        for _ in range(MAX_DEPTH):
            parent = self.nodes.get(node.parent) if node.parent is not None else None
            if parent is None or parent.id in seen or not parent.compressed:
                break
            if node.source == "tool" or node.branched or node.delegated:
                break
            node = parent
            seen.add(node.id)
        return node.id


# --------------------------------------------------------------------- repository


class LineageRepository(Repository):
    # ------------------------------------------------------------- plain parent links

    def ancestors(self, session_id: str, *, include_self: bool = True) -> list[str]:
        """Root first, ending with the session itself (or its parent); each id once."""
        ids = [r[0] for r in self.conn.execute(_ancestors_stmt(session_id)).fetchall()]
        return ids if include_self else ids[:-1]

    def descendants(self, session_id: str) -> list[str]:
        """Every session below this one (breadth order: depth, then start time)."""
        return [r[0] for r in self.conn.execute(_descendants_stmt(session_id)).fetchall()]

    def conversation_root(self, session_id: str) -> str:
        """The farthest ancestor through every parent link; the id itself when it has none
        or is unknown (a cycle ends at the ancestor met last before repeating)."""
        ids = self.ancestors(session_id)
        return ids[0] if ids else session_id

    # ------------------------------------------------------------- compression walks

    def _forward_graph(self, session_id: str) -> Graph:
        fwd = _forward(_seed(session_id))
        return Graph(self.conn.execute(_nodes(select(fwd.c.id))).fetchall())

    def compression_tip(self, session_id: str) -> str:
        """The end of the forward compression walk from ``session_id`` (Hermes v23 rules);
        the id itself when nothing continues it or it is unknown."""
        return self._forward_graph(session_id).tip(session_id)

    def resume_target(self, session_id: str) -> str:
        """Where a resume lands (Hermes v23): from the compression tip, walk down through the
        most recently started child (branches, delegates, tool runs skipped; ≤32 hops) and
        take the deepest session on that path holding any message row; else the tip.

        One statement: the forward subgraph, plus what lies up to 32 levels below its
        members that did not end 'compression' (where the tip can be).
        """
        fwd = _forward(_seed(session_id))
        seed = select(fwd.c.id, _ZERO.label("depth")).where(
            or_(fwd.c.end_reason.is_(None), fwd.c.end_reason != COMPRESSION)
        )
        below = seed.cte("below", recursive=True)
        child = _S.alias("below_c")
        below = below.union_all(
            select(child.c.id, below.c.depth + _ONE)
            .join_from(below, child, child.c.parent_session_id == below.c.id)
            .where(child.c.source != "tool", below.c.depth < RESUME_HOPS)
        )
        graph = Graph(self.conn.execute(_nodes(select(fwd.c.id).union(select(below.c.id)))).fetchall())
        tip = graph.tip(session_id)
        node = graph.get(tip)
        if node is None:
            return tip
        target = tip if node.has_messages else None
        seen = {node.id}
        for _ in range(RESUME_HOPS):
            nxt = node.newest_child()
            if nxt is None or nxt.id in seen:
                break
            node = nxt
            seen.add(node.id)
            if node.has_messages:
                target = node.id
        return target if target is not None else tip

    def compression_lineage(self, session_id: str) -> list[str]:
        """Hermes v23 ``get_compression_lineage``: root-first ids of the compression chain
        through this session; ``[]`` when unknown, ``[id]`` for a branch child or when the
        chain walked down from the root does not pass through the session.

        Up: while the row is not a branch child and its parent ended 'compression'.
        Down from that root: while the node ended 'compression', its earliest-started
        non-branch child (delegates and tool runs count here), past the session to the end.
        """
        climb = _climb([session_id], skip_tool=False)
        fwd = _forward(_seed(select(climb.c.id)), skip_tool=False)
        graph = Graph(self.conn.execute(_nodes(select(fwd.c.id))).fetchall())
        me = graph.get(session_id)
        if me is None:
            return []
        if me.branched:
            return [session_id]
        node, seen = me, {me.id}
        for _ in range(MAX_DEPTH):
            parent = graph.get(node.parent) if node.parent is not None else None
            if parent is None or parent.id in seen or not parent.compressed or node.branched:
                break
            node = parent
            seen.add(node.id)
        path, seen = [node.id], {node.id}
        for _ in range(MAX_DEPTH):
            if not node.compressed:
                break
            nxt = node.first_non_branch_child()
            if nxt is None or nxt.id in seen:
                break
            node = nxt
            seen.add(node.id)
            path.append(node.id)
        return path if session_id in seen else [session_id]

    def chain(self, session_id: str) -> list[str]:
        """Root → ... → session (every parent link) → ... → compression tip, one statement."""
        up = _up(session_id)
        fwd = _forward(_seed(session_id))
        text_null, real_null = cast(null(), String), cast(null(), Float)
        ups = select(
            literal_column("'up'", String).label("kind"), up.c.id, text_null, text_null,
            cast(func.min(up.c.depth), Float), real_null, text_null, text_null, real_null, cast(null(), Boolean),
        ).group_by(up.c.id)
        rows = self.conn.execute(_nodes(select(fwd.c.id), "fwd").union_all(ups)).fetchall()
        # the 'up' rows carry their distance from the session in started_at: farthest first
        above = [r.id for r in sorted((r for r in rows if r.kind == "up"), key=lambda r: (-r.started_at, r.id))]
        if not above:
            return []
        below = Graph(r for r in rows if r.kind == "fwd").forward_path(session_id)[1:]
        listed = set(above)
        return above + [sid for sid in below if sid not in listed]  # a cycle lists each id once

    def compression_tips(self, ids: Sequence[str]) -> dict[str, str]:
        """``{tip: root}`` for the given sessions that end a compression chain.

        A session is a tip when it continues a compressed parent (the forward edge) and
        the forward walk from its chain's root ends on it (Hermes v23: with several
        continuations only the preferred one leads to the tip). One statement.
        """
        ids = list(dict.fromkeys(ids))
        if not ids:
            return {}
        climb = _climb(ids, skip_tool=True)
        fwd = _forward(_seed(select(climb.c.id)))
        graph = Graph(self.conn.execute(_nodes(select(fwd.c.id))).fetchall())
        tips: dict[str, str] = {}
        roots: dict[str, str] = {}
        for sid in ids:
            if graph.get(sid) is None:
                continue
            root = graph.compression_root(sid)
            if root == sid:
                continue
            if root not in roots:
                roots[root] = graph.tip(root)
            if roots[root] == sid:
                tips[sid] = root
        return tips


__all__ = ["COMPRESSION", "Graph", "LineageRepository", "MAX_DEPTH", "Node", "RESUME_HOPS"]
