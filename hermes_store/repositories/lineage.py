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

Every recursive CTE of the package is built here (a test keeps it so): the walks
above, and the builders other modules call (:func:`parent_chain`,
:func:`compression_lineage_ids`, :func:`compression_ancestors`, :func:`compression_chains`,
:func:`delegate_tree_sql`), each written once and parameterized by what differs.

Each statement is built once, on first use, with the ids as bind parameters, so a call
pays neither its construction nor its compilation. A node row is lean: source and end
reason as 0/1 flags, ``model_config`` only where a marker substring can be, and the
walk runs over the rows themselves (a 1000-deep chain is 1000 dict lookups).

The forward compression edge (Hermes v23): parent ``end_reason='compression'`` →
child without ``_branched_from``, without ``_delegate_from`` and ``source != 'tool'``.
Unlike v11 there is no ``child.started_at >= parent.ended_at`` condition.

Hermes v26 names two more kinds of child. A *fork* is a tool run, or a child whose
``_branched_from``/``_delegate_from`` names its own parent: it never continues a
compressed parent (``get_compression_lineage``, the live-child and orphan checks). A
*reset child* carries ``_reset_from``, or (legacy) shares its parent's non-empty
``session_key`` while the parent ended with a reset reason: a resume never walks into it.
"""

from __future__ import annotations

import functools
import json
from operator import itemgetter
from typing import Any, TypeAlias
from collections.abc import Iterable, Sequence

from sqlalchemy import (
    Boolean,
    and_,
    Float,
    Integer,
    String,
    bindparam,
    case,
    cast,
    exists,
    func,
    literal_column,
    null,
    or_,
    select,
)
from sqlalchemy.sql import ColumnElement, Select
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.sql.selectable import CTE, CompoundSelect

from ..dialects.base import CLOSED_BY_COMPRESSION
from ..keys import RESET_END_REASONS, RESET_MARKER  # Hermes' _RESET_END_REASONS (v26)
from .base import MESSAGES, SESSIONS, Repository, fetch_tuples

#: The one bound of every walk through ``parent_session_id`` (ancestors, descendants
#: and compression chains, here, in listings and in the CLI). It only exists so a
#: corrupt cycle stops instead of spinning; it must never cut a real chain. Hermes v23
#: stops its compression and root walks after 100 hops; a long-running agent can
#: compress more often than that, so we keep the larger bound (a deliberate
#: difference: a chain deeper than 100 resumes at its real tip, not mid-chain).
MAX_DEPTH = 10_000

#: Hermes' bound on the resume walk below the compression tip (most recent child first).
RESUME_HOPS = 32

#: The end reason of a session continued by compression (the dialects' append guard
#: refuses new rows there, so one constant serves both).
COMPRESSION = CLOSED_BY_COMPRESSION
BRANCH_MARKER = "_branched_from"
DELEGATE_MARKER = "_delegate_from"

_S = SESSIONS
_M = MESSAGES
_ZERO = literal_column("0", Integer)
_ONE = literal_column("1", Integer)

#: ``kind`` of the rows of :func:`_chain_stmt` that list the ancestors (the others are 0).
_UP = 1
#: Statements below are built once (lazily, on first use) with bind parameters: the
#: session id is ``:sid``, id lists are the expanding ``:ids``. Reusing the object also
#: reuses its cache key, so SQLAlchemy's compiled cache hits without re-walking it.
SID = bindparam("sid", type_=String)
IDS = bindparam("ids", type_=String, expanding=True)
#: A walk's node rows (``kind``, then :func:`_node_columns`): their number depends on
#: ``messages``, so the row shape is spelled as "any columns".
Nodes: TypeAlias = Select[*tuple[Any, ...]]


# --------------------------------------------------------------------- plain parent links


def parent_chain(seed_id: Any = SID, *, name: str = "up", through_compression: bool = False,
                 depth: bool = True) -> CTE:
    """``name(id, parent[, depth])``: the session and every parent above it.

    ``through_compression``: climb only to parents that ended 'compression' (a turn
    lease's conversation). ``depth``: number the hops (UNION ALL, bounded by
    :data:`MAX_DEPTH` so a corrupt cycle stops); without it the walk is a UNION, which
    ends a cycle by itself.
    """
    columns = [_S.c.id, _S.c.parent_session_id.label("parent")]
    if not depth:
        seed = select(*columns).where(_S.c.id == seed_id).cte(name, recursive=True)
        parent = _S.alias("p")
        return seed.union(
            select(parent.c.id, parent.c.parent_session_id).select_from(parent.join(seed, parent.c.id == seed.c.parent))
        )
    up = select(*columns, _ZERO.label("depth")).where(_S.c.id == seed_id).cte(name, recursive=True)
    cond = [up.c.depth < MAX_DEPTH]
    if through_compression:
        cond.insert(0, _S.c.end_reason == COMPRESSION)
    step = (
        select(_S.c.id, _S.c.parent_session_id, up.c.depth + _ONE)
        .join_from(_S, up, _S.c.id == up.c.parent)
        .where(*cond)
    )
    return up.union_all(step)


def compression_lineage_ids(session_id: Any) -> Select[Any]:
    """The ids of a session's compression lineage, as a SELECT (archiving and lineage-wide
    flags update this row set).

    Up through parents that ended 'compression', then down to every child of a member
    that itself ended 'compression' (delegate and branch children of such members
    included). UNION keeps a corrupt parent cycle finite. Nesting CTEs: the SELECT is
    used inside an UPDATE's WHERE.
    """
    child, parent = _S.alias("lin_c"), _S.alias("lin_p")
    up = select(_S.c.id).where(_S.c.id == session_id).cte("lineage_up", recursive=True, nesting=True)
    up = up.union(
        select(parent.c.id)
        .select_from(up.join(child, child.c.id == up.c.id).join(parent, parent.c.id == child.c.parent_session_id))
        .where(parent.c.end_reason == COMPRESSION)
    )
    node, kid = _S.alias("lin_n"), _S.alias("lin_k")
    lineage = select(up.c.id).cte("lineage_all", recursive=True, nesting=True)
    lineage = lineage.union(
        select(kid.c.id)
        .select_from(lineage.join(node, node.c.id == lineage.c.id).join(kid, kid.c.parent_session_id == node.c.id))
        .where(node.c.end_reason == COMPRESSION)
    )
    return select(lineage.c.id)


def compression_ancestors(session_id: Any) -> CTE:
    """``up(id)``: the session's earlier selves, reached going up through parents that
    ended 'compression' (the session itself left out). UNION: cycle-safe."""
    child, parent = _S.alias("child"), _S.alias("parent")
    seed = (
        select(parent.c.id)
        .select_from(child.join(parent, parent.c.id == child.c.parent_session_id))
        .where(child.c.id == session_id, parent.c.end_reason == COMPRESSION)
    )
    up = seed.cte("up", recursive=True)
    step_child, step_parent = _S.alias("step_child"), _S.alias("step_parent")
    return up.union(
        select(step_parent.c.id)
        .select_from(
            up.join(step_child, step_child.c.id == up.c.id)
            .join(step_parent, step_parent.c.id == step_child.c.parent_session_id)
        )
        .where(step_parent.c.end_reason == COMPRESSION)
    )


def compression_chains(roots: CTE, child: Any, *conditions: ColumnElement[bool]) -> CTE:
    """``chain(root_id, id, end_reason)``: each root of ``roots`` (columns ``root_id``,
    ``id``, ``end_reason``) and the compression continuations below it: children (alias
    ``child`` of ``sessions``) of a member that ended 'compression', not tool runs, that
    also meet ``conditions``. UNION: cycle-safe."""
    chain = select(roots.c.root_id, roots.c.id, roots.c.end_reason).cte("chain", recursive=True)
    return chain.union(
        select(chain.c.root_id, child.c.id, child.c.end_reason)
        .join_from(chain, child, child.c.parent_session_id == chain.c.id)
        .where(chain.c.end_reason == COMPRESSION, child.c.source != "tool", *conditions)
    )


def delegate_tree_sql(parent_marks: str, delegate_of: Any) -> str:
    """SQLite SQL (Hermes' raw-connection helper): every session delegated, recursively,
    from the ids bound at ``parent_marks`` (``?,?``), parents included; ``delegate_of(col)``
    is the SQL reading a ``model_config`` column's ``_delegate_from``."""
    return (
        f"""WITH RECURSIVE tree(id) AS (
                SELECT id FROM sessions WHERE id IN ({parent_marks})
                UNION
                SELECT s.id FROM sessions s JOIN tree t
                  ON {delegate_of('s.model_config')} = t.id
                  OR (s.parent_session_id = t.id AND {delegate_of('s.model_config')} IS NOT NULL)
            )
            SELECT id FROM tree"""
    )


@functools.cache
def _ancestors_stmt() -> Select[Any, Any]:
    up = parent_chain()
    depth = func.min(up.c.depth).label("d")
    return select(up.c.id, depth).group_by(up.c.id).order_by(depth.desc())


@functools.cache
def _descendants_stmt() -> Select[Any]:
    seed = select(_S.c.id, _ZERO.label("depth")).where(_S.c.id == SID)
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


def _forward(seed: Select[Any, Any], name: str = "fwd", *, skip_tool: bool = True) -> CTE:
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
    step = select(child.c.id, child.c.end_reason).join_from(fwd, child, child.c.parent_session_id == fwd.c.id) \
        .where(*cond)
    return fwd.union(step)


def _seed(ids: Select[Any] | BindParameter[Any] = SID) -> Select[Any, Any]:
    """The seed of a forward walk: ``:sid`` (default), the expanding ``IDS`` or a select of ids."""
    where = _S.c.id.in_(ids) if isinstance(ids, Select) or ids is IDS else _S.c.id == ids
    return select(_S.c.id, _S.c.end_reason).where(where)


def _climb(*, skip_tool: bool) -> CTE:
    """``climb(id, parent, source)``: the sessions ``:ids`` and each parent that ended
    'compression' above them (through non-tool children when ``skip_tool``). UNION: cycle-safe."""
    seed = select(_S.c.id, _S.c.parent_session_id.label("parent"), _S.c.source).where(_S.c.id.in_(IDS))
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


def marker_text(t: Any) -> ColumnElement[Any]:
    """``model_config`` only where it may hold a lineage marker (a superset: ``_`` is a
    LIKE wildcard, SQLite's LIKE ignores case), else NULL: Python parses the few rows
    that can matter and the rest never travel."""
    mc = t.c.model_config
    return case((or_(mc.like(f"%{BRANCH_MARKER}%"), mc.like(f"%{DELEGATE_MARKER}%")), mc), else_=null())


def link_columns(t: Any) -> list[Any]:
    """``id, parent, tool, started_at, ended_at, compressed`` of ``t``: the walk's links and
    end state. Source and end reason travel as 0/1 flags: a walk only asks "a tool run?"
    and "ended 'compression'?", and a number is cheaper to send and read than a string."""
    return [
        t.c.id,
        t.c.parent_session_id,
        case((t.c.source == "tool", 1), else_=0).label("tool"),
        t.c.started_at,
        t.c.ended_at,
        case((t.c.end_reason == COMPRESSION, 1), else_=0).label("compressed"),
    ]


def _node_columns(kind: int, t: Any = _S, *, messages: bool = False) -> list[Any]:
    """What a walk needs of each session: links, end state, markers, latest activity
    (the shape :class:`Graph` reads, after the leading ``kind``). ``has_messages`` and
    the reset evidence only with ``messages`` (the resume walk): the EXISTS per node is
    a quarter of the work."""
    has = exists().where(_M.c.session_id == t.c.id) if messages else cast(null(), Boolean)
    columns = [
        literal_column(str(kind), Integer).label("kind"),
        *link_columns(t),
        marker_text(t).label("markers"),
        select(func.max(_M.c.timestamp)).where(_M.c.session_id == t.c.id).scalar_subquery().label("activity"),
        has.label("has_messages"),
    ]
    if messages:
        mc = t.c.model_config
        columns += [
            case((mc.like(f"%{RESET_MARKER}%"), mc), else_=null()).label("reset_marker"),
            t.c.session_key,
            case((t.c.end_reason.in_(RESET_END_REASONS), 1), else_=0).label("reset_ended"),
        ]
    return columns


def _nodes(ids_select: Select[Any] | CompoundSelect[Any], kind: int = 0, *, messages: bool = False) -> Nodes:
    return select(*_node_columns(kind, messages=messages)).where(_S.c.id.in_(ids_select))


def _forward_nodes() -> Nodes:
    """The forward subgraph of ``:sid`` (as :func:`_forward` walks it), shaped as
    :func:`_nodes` shapes it, in one walk.

    The recursion carries each member's node columns itself (no second read of the
    1,000 members of a deep chain by id), and the latest activity, which only ranks
    continuations of one parent against each other (:meth:`Graph.step`), is looked up
    only for members with a sibling in the subgraph: a plain chain reads no message.
    """
    def columns(t: Any) -> list[Any]:
        link = link_columns(t)
        return [*link[:5], t.c.end_reason, marker_text(t).label("markers")]

    fwd = select(*columns(_S)).where(_S.c.id == SID).cte("fwd", recursive=True)
    child = _S.alias("fwd_c")
    fwd = fwd.union(
        select(*columns(child)).join_from(fwd, child, child.c.parent_session_id == fwd.c.id)
        .where(fwd.c.end_reason == COMPRESSION, child.c.source != "tool")
    )
    latest = select(func.max(_M.c.timestamp)).where(_M.c.session_id == fwd.c.id).scalar_subquery()
    siblings = func.count().over(partition_by=fwd.c.parent_session_id)
    return select(
        literal_column("0", Integer).label("kind"), fwd.c.id, fwd.c.parent_session_id, fwd.c.tool,
        fwd.c.started_at, fwd.c.ended_at, case((fwd.c.end_reason == COMPRESSION, 1), else_=0).label("compressed"),
        fwd.c.markers, case((siblings > 1, latest), else_=null()).label("activity"),
        cast(null(), Boolean).label("has_messages"),
    )


def straight_ends(roots: Any, name: str = "sw") -> CTE:
    """``name_end(root, id, depth, sure)``: for each row of ``roots`` (columns ``id``,
    ``end_reason``), where the forward compression walk from it goes while each step is
    the one child a member that ended 'compression' has (tool runs left out) and that
    child can hold no branch or delegate marker: the step :meth:`Graph.step` takes
    there, as in :func:`_straight_tip_stmt`, for many roots at once.

    ``sure`` is 1 when the walk surely ends on ``id`` (the member did not end
    'compression', or has no child but tool runs), 0 when :class:`Graph` must decide
    (a choice, a possible marker, or :data:`MAX_DEPTH` reached: a cycle). One row per
    step (UNION ALL, a step has one child), so the deepest row of a root is its end.
    """
    walk = select(roots.c.id.label("root"), roots.c.id, roots.c.end_reason, _ZERO.label("depth")).cte(
        f"{name}_walk", recursive=True)
    child, other, kid = _S.alias(f"{name}_c"), _S.alias(f"{name}_o"), _S.alias(f"{name}_k")
    walk = walk.union_all(
        select(walk.c.root, child.c.id, child.c.end_reason, walk.c.depth + _ONE)
        .join_from(walk, child, child.c.parent_session_id == walk.c.id)
        .where(
            walk.c.end_reason == COMPRESSION, walk.c.depth < MAX_DEPTH, child.c.source != "tool",
            marker_text(child).is_(None),
            ~exists().where(other.c.parent_session_id == walk.c.id, other.c.source != "tool", other.c.id != child.c.id),
        )
    )
    ranked = select(walk, func.max(walk.c.depth).over(partition_by=walk.c.root).label("last")).subquery(
        f"{name}_ranked")
    more = and_(ranked.c.end_reason == COMPRESSION,
                exists().where(kid.c.parent_session_id == ranked.c.id, kid.c.source != "tool"))
    sure = case((or_(more, ranked.c.depth >= MAX_DEPTH), 0), else_=1)
    return (
        select(ranked.c.root, ranked.c.id, ranked.c.depth, sure.label("sure"))
        .where(ranked.c.depth == ranked.c.last)
        .cte(f"{name}_end")
    )


#: ``kind`` of the row of :func:`_straight_tip_stmt` that says where the walk ended.
_STRAIGHT = 2


@functools.cache
def _straight_tip_stmt() -> CompoundSelect[*tuple[Any, ...]]:
    """The compression tip of ``:sid`` in one statement, without the whole chain when
    the walk has no choice to make.

    First row (kind :data:`_STRAIGHT`): where the forward walk goes while each step is
    the one child a member that ended 'compression' has (tool runs left out, as
    :func:`_forward` leaves them) and that child can hold no branch or delegate marker
    (:func:`marker_text` NULL): the step :meth:`Graph.step` takes there. Its ``tool``
    column says whether the walk may go on (the last member ended 'compression' and has
    children: a choice, or a marker only Python reads), its ``started_at`` the depth
    (:data:`MAX_DEPTH`: a cycle, or a chain past the bound). Only then do the rows of
    :func:`_forward_nodes` follow, for :meth:`Graph.tip` (the graph's part of the plan
    is not run otherwise)."""
    walk = select(_S.c.id, _S.c.end_reason, _ZERO.label("depth")).where(_S.c.id == SID).cte(
        "straight", recursive=True)
    child, other, kid = _S.alias("straight_c"), _S.alias("straight_o"), _S.alias("straight_k")
    walk = walk.union_all(
        select(child.c.id, child.c.end_reason, walk.c.depth + _ONE)
        .join_from(walk, child, child.c.parent_session_id == walk.c.id)
        .where(
            walk.c.end_reason == COMPRESSION, walk.c.depth < MAX_DEPTH, child.c.source != "tool",
            marker_text(child).is_(None),
            ~exists().where(other.c.parent_session_id == walk.c.id, other.c.source != "tool", other.c.id != child.c.id),
        )
    )
    more = and_(walk.c.end_reason == COMPRESSION,
                exists().where(kid.c.parent_session_id == walk.c.id, kid.c.source != "tool"))
    end = select(walk.c.id, walk.c.depth, case((more, 1), else_=0).label("more")) \
        .order_by(walk.c.depth.desc()).limit(1).cte("straight_end")
    text_null, real_null, int_null = cast(null(), String), cast(null(), Float), cast(null(), Integer)
    summary = select(
        literal_column(str(_STRAIGHT), Integer).label("kind"), end.c.id, text_null, end.c.more,
        cast(end.c.depth, Float), real_null, int_null, text_null, real_null, cast(null(), Boolean),
    )
    unsure = exists().where(or_(end.c.more == 1, end.c.depth >= MAX_DEPTH))
    return summary.union_all(_forward_nodes().where(unsure))


@functools.cache
def _resume_stmt() -> Nodes:
    """The forward subgraph of ``:sid``, plus what lies up to 32 levels below its members
    that did not end 'compression' (where the tip can be)."""
    fwd = _forward(_seed())
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
    return _nodes(select(fwd.c.id).union(select(below.c.id)), messages=True)


@functools.cache
def _lineage_stmt() -> Nodes:
    climb = _climb(skip_tool=False)
    fwd = _forward(_seed(select(climb.c.id)), skip_tool=False)
    return _nodes(select(fwd.c.id))


@functools.cache
def _tips_stmt() -> Nodes:
    climb = _climb(skip_tool=True)
    fwd = _forward(_seed(select(climb.c.id)))
    return _nodes(select(fwd.c.id))


#: Joins the ids of a parent walk into one text value in :func:`_chain_stmt` (an id holding
#: it is caught by the count, and the walk read again a row per step).
_ID_SEP = "\x1f"


def _chain_ups(*, joined: bool) -> Select[Any]:
    """The 'up' part of :func:`_chain_stmt` (kind :data:`_UP`), in the node row shape.

    ``joined``: one row holding the walk's ids joined by :data:`_ID_SEP` (``id``), their
    distances joined by commas, in the same order (``parent``) and their number
    (``tool``): a 1,000-deep walk is one value to send and to load, not 1,000 rows of
    ten columns. Else one row per step, the distance in ``tool``. No GROUP BY either
    way: each step of the walk is one row (a parent is one row of a primary key), so only
    a corrupt cycle repeats an id, and :meth:`LineageRepository.chain` keeps it once."""
    up = parent_chain()
    text_null, real_null, int_null = cast(null(), String), cast(null(), Float), cast(null(), Integer)
    if joined:
        links: list[Any] = [func.aggregate_strings(up.c.id, _ID_SEP),
                            func.aggregate_strings(cast(up.c.depth, String), ","), func.count()]
    else:
        links = [up.c.id, text_null, up.c.depth]
    return select(literal_column(str(_UP), Integer).label("kind"), *links,
                  real_null, real_null, int_null, text_null, real_null, cast(null(), Boolean))


@functools.cache
def _chain_stmt(joined: bool = True) -> CompoundSelect[*tuple[Any, ...]]:
    """The forward walk's node rows (kind 0), then the parent walk (:func:`_chain_ups`)."""
    return _forward_nodes().union_all(_chain_ups(joined=joined))


# --------------------------------------------------------------------- the walks (Python side)


def _marker(model_config: Any, key: str) -> bool:
    """Whether the JSON object in ``model_config`` names ``key`` (JSON null does not count).

    Same test as SQLite's ``json_extract(model_config, '$.key') IS NOT NULL`` on valid
    JSON; malformed JSON or a non-object counts as no marker.
    """
    return marker_value(model_config, key) is not None


def marker_value(model_config: Any, key: str) -> Any:
    """The value ``key`` holds in the JSON object ``model_config`` (None: absent, JSON
    null, malformed JSON or not an object)."""
    if not model_config or not isinstance(model_config, str) or key not in model_config:
        return None
    try:
        value = json.loads(model_config)
    except ValueError:
        return None
    return value.get(key) if isinstance(value, dict) else None


def is_fork(*, tool: bool, model_config: Any, parent_id: Any) -> bool:
    """Hermes v26: a tool run, or a branch/delegate of its own parent, is a fork and never
    continues that parent (a marker naming some other session does not count)."""
    if tool:
        return True
    if parent_id is None:
        return False
    return parent_id in (marker_value(model_config, BRANCH_MARKER), marker_value(model_config, DELEGATE_MARKER))


def _num(value: Any) -> float:
    """A sortable number for a REAL column (NULL or junk sorts lowest)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("-inf")


#: Positions in a node row (after ``kind``): see :func:`_node_columns`; the last three
#: only in rows of the resume walk.
_ID, _PARENT, _TOOL, _STARTED, _ENDED, _COMPRESSED, _MARKERS, _ACTIVITY, _HAS, _RESET, _KEY, _RESET_ENDED = range(1, 13)


#: Sort keys of :meth:`LineageRepository.chain`: an 'up' row's distance, a (distance, id) pair's.
_BY_DISTANCE, _FIRST = itemgetter(_TOOL), itemgetter(0)


def _marked(row: Any) -> bool:
    """Whether the row is a branch or a delegate (NULL ``markers``: surely neither)."""
    config = row[_MARKERS]
    return config is not None and (_marker(config, BRANCH_MARKER) or _marker(config, DELEGATE_MARKER))


def _rank(row: Any) -> tuple[int, float, float, str]:
    """Hermes v23 per-step order of forward children: compressed, then live, then the rest;
    then latest activity (newest message, else start), start, id (the max wins)."""
    tier = 0 if row[_COMPRESSED] else (1 if row[_ENDED] is None else 2)
    active = row[_ACTIVITY] if row[_ACTIVITY] is not None else row[_STARTED]
    return (-tier, _num(active), _num(row[_STARTED]), row[_ID])


class Node:
    """One fetched session (a view of its row in a :class:`Graph`)."""

    __slots__ = (
        "activity",
        "branched",
        "compressed",
        "delegated",
        "ended_at",
        "fork",
        "graph",
        "has_messages",
        "id",
        "parent",
        "row",
        "started_at",
        "tool",
    )

    def __init__(self, graph: Graph, row: Any) -> None:
        self.graph = graph
        self.row = row
        self.id = row[_ID]
        self.parent = row[_PARENT]
        self.tool = bool(row[_TOOL])  # source = 'tool'
        self.started_at = row[_STARTED]
        self.ended_at = row[_ENDED]
        self.compressed = bool(row[_COMPRESSED])  # end_reason = 'compression'
        self.activity = row[_ACTIVITY]
        self.has_messages = bool(row[_HAS])
        config = row[_MARKERS]  # NULL when no marker can be there (most rows)
        self.branched = config is not None and _marker(config, BRANCH_MARKER)
        self.delegated = config is not None and _marker(config, DELEGATE_MARKER)
        self.fork = is_fork(tool=self.tool, model_config=config, parent_id=self.parent)

    @property
    def children(self) -> list[Node]:
        return [self.graph.node(r) for r in self.graph.kids.get(self.id, ())]

    def continues_as(self) -> Node | None:
        """The preferred forward compression child (Hermes v23 per-step order)."""
        row = self.graph.step(self.row)
        return None if row is None else self.graph.node(row)

    def newest_child(self) -> Node | None:
        """The most recently started child that is neither a branch, a delegate, a tool run
        nor (in rows of the resume walk) a reset child."""
        kids = [c for c in self.children
                if not c.tool and not c.branched and not c.delegated and not self.reset_into(c)]
        return max(kids, key=lambda c: (_num(c.started_at), c.id)) if kids else None

    def reset_into(self, child: Node) -> bool:
        """Whether ``child`` began after a reset of this session (Hermes v26): it carries
        ``_reset_from``, or shares this session's non-empty ``session_key`` while this
        session ended with a reset reason. Only rows of the resume walk hold the evidence."""
        me, kid = self.row, child.row
        if len(kid) <= _RESET_ENDED:
            return False
        if _marker(kid[_RESET], RESET_MARKER):
            return True
        return bool(me[_RESET_ENDED]) and bool(kid[_KEY]) and kid[_KEY] == me[_KEY]

    def first_continuation(self) -> Node | None:
        """The earliest-started child that is not a fork (Hermes v26's lineage rule)."""
        kids = [c for c in self.children if not c.fork]
        return min(kids, key=lambda c: (_num(c.started_at), c.id)) if kids else None


class Graph:
    """The fetched sessions (rows shaped like :func:`_node_columns`), linked parent → children.

    Kept as the rows themselves (a dict by id, children lists by parent id): a forward
    walk over a 1000-deep chain then costs dict lookups, not 1000 objects; a
    :class:`Node` is made only for the sessions a caller asks about.
    """

    def __init__(self, rows: Iterable[Any]) -> None:
        self.rows: dict[str, Any] = {}
        found = self.rows
        for row in rows:
            if row[_ID] not in found:
                found[row[_ID]] = row
        self.kids: dict[str, list[Any]] = {}
        kids = self.kids
        for row in found.values():
            parent = row[_PARENT]
            if parent is not None and parent in found:
                if parent in kids:
                    kids[parent].append(row)
                else:
                    kids[parent] = [row]
        self._nodes: dict[str, Node] = {}

    def node(self, row: Any) -> Node:
        found = self._nodes.get(row[_ID])
        if found is None:
            found = self._nodes[row[_ID]] = Node(self, row)
        return found

    def get(self, session_id: str) -> Node | None:
        row = self.rows.get(session_id)
        return None if row is None else self.node(row)

    def step(self, row: Any) -> Any:
        """The row the forward walk takes after ``row`` (None: the walk ends there)."""
        if not row[_COMPRESSED]:
            return None
        kids = self.kids.get(row[_ID])
        if not kids:
            return None
        if len(kids) == 1:  # a plain chain: no list, no ranking
            kid = kids[0]
            if kid[_TOOL] or (kid[_MARKERS] is not None and _marked(kid)):
                return None
            return kid
        walkable = [k for k in kids if not k[_TOOL] and not _marked(k)]
        return max(walkable, key=_rank) if walkable else None

    def tip(self, session_id: str) -> str:
        """Where the forward walk from the session ends (the id itself when unknown)."""
        path = self.forward_path(session_id)
        return path[-1] if path else session_id

    def forward_path(self, session_id: str) -> list[str]:
        """The session, then each preferred forward compression step, until none is left or
        the next one would revisit a session (a corrupt cycle)."""
        row = self.rows.get(session_id)
        if row is None:
            return []
        path = [row[_ID]]
        seen = {row[_ID]}
        step = self.step
        for _ in range(MAX_DEPTH):
            row = step(row)
            if row is None or row[_ID] in seen:
                break
            seen.add(row[_ID])
            path.append(row[_ID])
        return path

    def compression_root(self, session_id: str) -> str:
        """Climb while the session is a forward compression child of its parent."""
        rows = self.rows
        row = rows[session_id]
        seen = {row[_ID]}
        for _ in range(MAX_DEPTH):
            parent = rows.get(row[_PARENT]) if row[_PARENT] is not None else None
            if parent is None or parent[_ID] in seen or not parent[_COMPRESSED]:
                break
            if row[_TOOL] or _marked(row):
                break
            row = parent
            seen.add(row[_ID])
        root: str = row[_ID]
        return root


# --------------------------------------------------------------------- repository


class LineageRepository(Repository):
    # ------------------------------------------------------------- plain parent links

    def ancestors(self, session_id: str, *, include_self: bool = True) -> list[str]:
        """Root first, ending with the session itself (or its parent); each id once."""
        ids = [r[0] for r in self.conn.execute(_ancestors_stmt(), {"sid": session_id}).fetchall()]
        return ids if include_self else ids[:-1]

    def descendants(self, session_id: str) -> list[str]:
        """Every session below this one (breadth order: depth, then start time)."""
        return [r[0] for r in self.conn.execute(_descendants_stmt(), {"sid": session_id}).fetchall()]

    def conversation_root(self, session_id: str) -> str:
        """The farthest ancestor through every parent link; the id itself when it has none
        or is unknown (a cycle ends at the ancestor met last before repeating)."""
        ids = self.ancestors(session_id)
        return ids[0] if ids else session_id

    # ------------------------------------------------------------- compression walks

    def compression_tip(self, session_id: str) -> str:
        """The end of the forward compression walk from ``session_id`` (Hermes v23 rules);
        the id itself when nothing continues it or it is unknown.

        A chain without a choice on the way (the common case: one continuation per
        step) is walked in SQL and only its end comes back (:func:`_straight_tip_stmt`);
        a choice, a possible marker or a cycle brings the whole forward subgraph in the
        same statement, ranked in Python (:meth:`Graph.tip`)."""
        rows = self.conn.execute(_straight_tip_stmt(), {"sid": session_id}).fetchall()
        end = next((r for r in rows if r[0] == _STRAIGHT), None)
        if end is None:
            return session_id  # unknown
        if not end[_TOOL] and end[_STARTED] < MAX_DEPTH:
            return str(end[_ID])
        return Graph(r for r in rows if r[0] != _STRAIGHT).tip(session_id)

    def resume_target(self, session_id: str) -> str:
        """Where a resume lands (Hermes v26): from the compression tip, walk down through the
        most recently started child (branches, delegates, tool runs and reset children
        skipped; ≤32 hops) and take the deepest session on that path holding any message
        row; else the tip.

        One statement: the forward subgraph, plus what lies up to 32 levels below its
        members that did not end 'compression' (where the tip can be).
        """
        graph = Graph(self.conn.execute(_resume_stmt(), {"sid": session_id}).fetchall())
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
        """Hermes v26 ``get_compression_lineage``: root-first ids of the compression chain
        through this session; ``[]`` when unknown, ``[id]`` for a branch child or when the
        chain walked down from the root does not pass through the session.

        Up: while the row is not a fork and its parent ended 'compression'. Down from that
        root: while the node ended 'compression', its earliest-started child that is not a
        fork (v26: a delegate or tool run of the parent no longer takes the chain over),
        past the session to the end.
        """
        graph = Graph(self.conn.execute(_lineage_stmt(), {"ids": [session_id]}).fetchall())
        me = graph.get(session_id)
        if me is None:
            return []
        if me.branched:
            return [session_id]
        node, seen = me, {me.id}
        for _ in range(MAX_DEPTH):
            parent = graph.get(node.parent) if node.parent is not None else None
            if parent is None or parent.id in seen or not parent.compressed or node.fork:
                break
            node = parent
            seen.add(node.id)
        path, seen = [node.id], {node.id}
        for _ in range(MAX_DEPTH):
            if not node.compressed:
                break
            nxt = node.first_continuation()
            if nxt is None or nxt.id in seen:
                break
            node = nxt
            seen.add(node.id)
            path.append(node.id)
        return path if session_id in seen else [session_id]

    def chain(self, session_id: str) -> list[str]:
        """Root → ... → session (every parent link) → ... → compression tip, one statement
        (two when an id holds :data:`_ID_SEP`)."""
        rows = fetch_tuples(self.conn.execute(_chain_stmt(), {"sid": session_id}))
        ups = next(r for r in rows if r[0] == _UP)
        count = ups[_TOOL] or 0
        if not count:
            return []
        above: list[str] = ups[_ID].split(_ID_SEP)
        if len(above) == count:
            distances = list(map(int, ups[_PARENT].split(",")))
            if distances == list(range(count)):  # the walk's own order: nearest first
                above.reverse()
            elif distances != list(range(count - 1, -1, -1)):
                above = [sid for _, sid in sorted(zip(distances, above, strict=True), key=_FIRST, reverse=True)]
        else:  # an id holds the separator: the walk again, a row per step
            rows = fetch_tuples(self.conn.execute(_chain_stmt(False), {"sid": session_id}))
            up = [r for r in rows if r[0] == _UP]
            up.sort(key=_BY_DISTANCE, reverse=True)  # farthest first (distances are distinct)
            above = [r[1] for r in up]
        if len(set(above)) != len(above):  # a corrupt cycle: each id at its nearest distance
            nearest = list(dict.fromkeys(reversed(above)))
            nearest.reverse()
            above = nearest
        forward = [r for r in rows if r[0] != _UP]
        below = Graph(forward).forward_path(session_id)[1:] if forward else []
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
        graph = Graph(self.conn.execute(_tips_stmt(), {"ids": ids}).fetchall())
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


__all__ = [
    "COMPRESSION",
    "MAX_DEPTH",
    "RESET_END_REASONS",
    "RESUME_HOPS",
    "Graph",
    "LineageRepository",
    "Node",
    "is_fork",
    "marker_value",
]
