"""Listing and counting sessions (Hermes v23 ``list_sessions_rich``, ``session_count``,
``list_cron_job_runs``, ``search_sessions_by_id``, ``search_sessions``).

SQLAlchemy Core against the model tables, the same statements on SQLite and PostgreSQL.
Each statement is built once per shape (which columns the file has, which filters are
given, compact or not) with bind parameters for every value, so a call pays neither
the construction of 60-odd column proxies nor a fresh compile.

Lineage markers. Which children are listed, and which children continue a compression
chain, depends on the ``_branched_from`` / ``_delegate_from`` keys inside the
``model_config`` JSON. PostgreSQL cannot test those in SQL without failing on a row
whose JSON is malformed, so, as in :mod:`.lineage`, they are decided in Python with
:func:`.lineage._marker`: a substring ``LIKE`` finds every row that may carry a
marker, and the few such rows that do not really carry it (malformed JSON, a JSON null,
a nested key, the words inside a string) are named in the statement as exceptions.
Only the rows where a marker can change the answer are read: children (branch marker),
and for the delegate marker roots, children of a 'compression' or 'branched' parent and
branch-marked rows. They travel in the same statement as the page, which is first run
with no exceptions; only when one of them turns out to be an exception (rare: it takes
a malformed or odd ``model_config``) is the statement run again, naming them.

Compression chains (Hermes v23 forward edge, no timestamp condition): parent
``end_reason='compression'`` → child that is not a tool run, not a branch and not a
delegate. Ordering by chain activity and the ``id_query`` / ``search_query`` filters
use every session reachable that way (a recursive UNION, so a corrupt cycle ends by
itself); the projected tip is where :class:`.lineage.Graph` walks, Hermes' per-step
preference order (the same rule as ``get_compression_tip``). The page's forward
subgraph comes with the page, and with it the full rows of the sessions that can end
a walk (a session with a child the walk surely takes cannot); only a tip that is not
among them (a corrupt cycle) costs a second statement.
"""

from __future__ import annotations

import functools
import re
import typing
from operator import itemgetter
from typing import Any, NamedTuple
from collections.abc import Iterable, Sequence

from sqlalchemy import (
    BigInteger,
    Integer,
    String,
    and_,
    bindparam,
    case,
    cast,
    exists,
    false,
    func,
    literal_column,
    not_,
    null,
    or_,
    select,
    union_all,
)
from sqlalchemy.sql import ColumnElement, Executable, Select
from sqlalchemy.sql.selectable import Alias, CompoundSelect

from .. import errors
from ..codec import clean_text, decode_content
from ..models import Base
from ..search.query import escape_like
from ..skills import (
    PREVIEW_CHARS,
    SKILL_INVOCATION_PREFIX,
    SKILL_PREVIEW_HEAD,
    SKILL_PREVIEW_JOIN,
    SKILL_PREVIEW_TAIL,
    skill_preview,
)
from .base import ID_CHUNK, MESSAGES, SESSIONS, Repository, fetch_tuples
from .lineage import (
    BRANCH_MARKER,
    COMPRESSION,
    DELEGATE_MARKER,
    IDS,
    Graph,
    _forward,
    compression_chains,
    straight_ends,
    _marker,
    link_columns,
    marker_text,
)
from .records import SessionRecord
from ..keys import MAX_ROWS, RESET_END_REASONS, RESET_MARKER
from .sessions import SessionRepository

#: What a projected compression tip brings to its chain's row (Hermes v23), plus the
#: v25 companions of two of them (where the prompt is stored, who set the title).
TIP_COLUMNS = (
    "id", "ended_at", "end_reason", "message_count", "tool_call_count", "title", "last_active", "preview",
    "model", "system_prompt", "cwd", "git_branch", "git_repo_root", "system_prompt_hash", "title_source",
)
#: Characters ``search_query`` ignores when comparing with a title ("my-app" finds "My App").
_COMPACT = ("-", "_", ".", " ")
_COMPACT_RE = re.compile("[" + re.escape("".join(_COMPACT)) + "]")
_NEWLINES = re.compile(r"[\r\n]+")

_S = SESSIONS
_M = MESSAGES
_SP = Base.metadata.tables["system_prompts"]
#: Aliases built once: each one's column collection (60-odd proxies) costs milliseconds.
_LISTED, _PARENT = _S.alias("s"), _S.alias("p")
_MARKED, _MARKED_PARENT = _S.alias("mk"), _S.alias("mk_p")
_ROW, _CHILD, _MEMBER = _S.alias("t"), _S.alias("chain_c"), _S.alias("mem")
_NODE, _FULL, _CAND = _S.alias("n"), _S.alias("f"), _S.alias("cand_c")

#: Bind parameters of the listing statements (values travel in the params dict). The
#: exceptions have one parameter for IN and another for NOT IN: SQLAlchemy renders an
#: empty expanding list per parameter name, and PostgreSQL's empty-IN form is not the
#: empty-NOT-IN form.
_EXCEPTIONS = {key: bindparam(f"exc_{key.strip('_')}", type_=String, expanding=True)
               for key in (BRANCH_MARKER, DELEGATE_MARKER)}
_NOT_EXCEPTIONS = {key: bindparam(f"not_exc_{key.strip('_')}", type_=String, expanding=True)
                   for key in (BRANCH_MARKER, DELEGATE_MARKER)}
_INCLUDE = bindparam("inc", type_=String, expanding=True)
_EXCLUDE = bindparam("exc", type_=String, expanding=True)
_CWD, _CWD_SLASH, _CWD_BACKSLASH = (bindparam(n, type_=String) for n in ("cwd", "cwd_slash", "cwd_backslash"))
_LEAST = bindparam("least", type_=BigInteger)
_LIMIT, _OFFSET = bindparam("limit", type_=BigInteger), bindparam("offset", type_=BigInteger)
_IDS_PAT, _TEXT_PAT, _SQUEEZED_PAT = (bindparam(n, type_=String) for n in ("ids_pat", "text_pat", "squeezed_pat"))
_PREFIX = bindparam("prefix", type_=String)
_SESSION_KEY = bindparam("session_key", type_=String)
_SKILL_PATTERN = escape_like(SKILL_INVOCATION_PREFIX) + "%"
_WORKSPACE, _WORKSPACE_SLASH = bindparam("ws", type_=String), bindparam("ws_slash", type_=String)
#: Hermes' reset-child marker and the end reasons a reset follows (v26 §5.2).
#: Columns ``compact_rows`` leaves out (Hermes v26): the prompt, its key, the git probe counter.
COMPACT_DROPS = frozenset({"system_prompt", "system_prompt_hash", "git_metadata_generation"})

#: Row kinds in a listing statement: a page row, a node of the page's forward
#: subgraph, a row whose marker substring must be checked in Python, (counts,) and the
#: tip of a chain walked in SQL (its root in the next-to-last column).
PAGE, NODE, MARKED, COUNTED, TIP = 0, 1, 2, 3, 4
#: Pages longer than this walk their plain compression chains in SQL (:func:`.lineage.straight_ends`):
#: the walk's CTEs cost a short page more than they save it (SQLite, 10k bench, page of
#: 20: 1.2 -> 1.6 ms), and save a long one most of its rows (all 448: 1,552 -> 479 rows).
STRAIGHT_WALK_FROM = 96
#: Assistant turns read while looking for the first one with text.
_SCAN_ROWS = 50
#: A listing row's place in its page (the last column; see :func:`_page`).
_BY_RN = itemgetter(-1)
#: Where the full session columns start in a listing row (kind + the 9 node columns).
_FULL_AT = 10


# --------------------------------------------------------------------------- arguments


def _listed(values: str | Iterable[str] | None) -> list[str]:
    """A source argument as a list: one name, several, or none (falsy = no filter)."""
    if not values:
        return []
    items = [values] if isinstance(values, str) else [v for v in values if v is not None]
    return [clean_text(v) if isinstance(v, str) else v for v in items]


def _count_arg(value: Any, name: str) -> int:
    """A non-negative row count (None → 0); huge values clamp to MAX_ROWS."""
    if value is None:
        return 0
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise errors.InvalidInputError(f"{name} must be an integer, not {value!r}") from exc
    return min(max(number, 0), MAX_ROWS)


def _needle(value: Any) -> str:
    """A listing query as Hermes compares it: trimmed and lowercased ('' = no filter)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise errors.InvalidInputError(f"a session query must be a string, not {type(value).__name__}")
    return clean_text(value).strip().lower()


def _contains(needle: str) -> str:
    """A LIKE pattern (ESCAPE '\\') finding ``needle`` anywhere, wildcards taken literally."""
    return f"%{escape_like(needle)}%"


def make_preview(content: Any) -> str:
    """First user message, newlines folded, cut to 60 characters plus '...'; a skill
    invocation shows as ``/skill — instruction`` (Hermes v26 §5.4)."""
    value = decode_content(content) if isinstance(content, str) else content
    if value is None:
        return ""
    described = skill_preview(value, PREVIEW_CHARS)
    if described is not None:
        return described
    if not isinstance(value, str):
        parts = [p.get("text", "") for p in value if isinstance(p, dict)] if isinstance(value, list) else []
        value = " ".join(x for x in parts if isinstance(x, str) and x)
    text = _NEWLINES.sub(" ", value).strip()
    return text[:PREVIEW_CHARS] + "..." if len(text) > PREVIEW_CHARS else text


# --------------------------------------------------------------------------- expressions


def last_active(t: Alias | Any, has_activity: bool) -> ColumnElement[Any]:
    """Hermes' recency of a session (v24 ``_sql_session_last_active``), in its own shape.

    The later of ``last_activity_at`` (the activity watchdog's stamp) and the newest
    message, else the start: ``COALESCE((SELECT max(v) FROM (stamp UNION ALL newest)),
    started_at)``, which reads the newest message once per row.
    """
    newest = select(func.max(_M.c.timestamp)).where(_M.c.session_id == t.c.id).correlate(t).scalar_subquery()
    if not has_activity:
        return func.coalesce(newest, t.c.started_at)
    both = union_all(select(t.c.last_activity_at.label("v")).correlate(t), select(newest.label("v"))).subquery("la")
    return func.coalesce(select(func.max(both.c.v)).correlate(t).scalar_subquery(), t.c.started_at)


def _first_user_content(t: Alias | Any) -> ColumnElement[Any]:
    return (
        select(_M.c.content)
        .where(_M.c.session_id == t.c.id, _M.c.role == "user")
        .order_by(_M.c.timestamp, _M.c.id)
        .limit(1)
        .correlate(t)
        .scalar_subquery()
    )


def _preview_source(t: Alias | Any) -> ColumnElement[Any]:
    """The first user turn as a preview reads it: a long skill invocation only by its
    head and tail (Hermes v26 §5.4: 400 characters, ``\\x1e``, 400), anything else whole."""
    first = (
        select(_M.c.content.label("c"))
        .where(_M.c.session_id == t.c.id, _M.c.role == "user")
        .order_by(_M.c.timestamp, _M.c.id)
        .limit(1)
        .correlate(t)
        .subquery("fu")
    )
    keep = SKILL_PREVIEW_HEAD + SKILL_PREVIEW_TAIL
    cut = case(
        (and_(first.c.c.like(_SKILL_PATTERN, escape="\\"), func.length(first.c.c) > keep),
         func.substr(first.c.c, 1, SKILL_PREVIEW_HEAD, type_=String).concat(SKILL_PREVIEW_JOIN)
         .concat(func.substr(first.c.c, func.length(first.c.c) - (SKILL_PREVIEW_TAIL - 1), type_=String))),
        else_=first.c.c,
    )
    return select(cut).correlate(t).scalar_subquery()


def _compact(expr: ColumnElement[Any]) -> ColumnElement[Any]:
    for ch in _COMPACT:
        expr = func.replace(expr, ch, "")
    return expr


def _has(t: Any, key: str) -> ColumnElement[bool]:
    """``model_config`` holds the key as a substring and the row is not an exception."""
    return and_(t.c.model_config.like(_contains(key), escape="\\"), t.c.id.not_in(_NOT_EXCEPTIONS[key]))


def _lacks(t: Any, key: str) -> ColumnElement[bool]:
    """The negation of :func:`_has` (NULL ``model_config`` lacks every marker)."""
    return or_(t.c.model_config.is_(None), not_(t.c.model_config.like(_contains(key), escape="\\")),
               t.c.id.in_(_EXCEPTIONS[key]))


def _marker_scope() -> Select[Any, Any]:
    """``(id, model_config)`` of the rows whose marker substring can change a listing.

    The substring tests come first, so the parent is looked up only for the rows that
    mention a delegate marker.
    """
    s, p = _MARKED, _MARKED_PARENT
    mc = s.c.model_config
    branch_like = mc.like(_contains(BRANCH_MARKER), escape="\\")
    delegate_like = mc.like(_contains(DELEGATE_MARKER), escape="\\")
    parent_elsewhere = exists().where(  # a parent row that neither compressed nor branched
        p.c.id == s.c.parent_session_id,
        or_(p.c.end_reason.is_(None), p.c.end_reason.not_in((COMPRESSION, "branched"))),
    )
    scope = or_(
        and_(branch_like, s.c.parent_session_id.is_not(None)),
        and_(delegate_like, or_(s.c.parent_session_id.is_(None), branch_like, not_(parent_elsewhere))),
    )
    return select(s.c.id, mc).where(scope)


def exceptions_of(marked: Iterable[tuple[str, Any]]) -> dict[str, list[str]]:
    """Per marker key, the ids whose ``model_config`` has the substring but not the marker."""
    found: dict[str, list[str]] = {BRANCH_MARKER: [], DELEGATE_MARKER: []}
    for sid, config in marked:
        for key, ids in found.items():
            if not isinstance(config, str):
                ids.append(sid)  # a LIKE may match bytes; they never carry a marker
            elif key.lower() in config.lower() and not _marker(config, key):
                ids.append(sid)
    return found


def _exception_params(found: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    found = found or {}
    params = {_EXCEPTIONS[key].key: sorted(found.get(key, ())) for key in _EXCEPTIONS}
    params.update((_NOT_EXCEPTIONS[key].key, params[_EXCEPTIONS[key].key]) for key in _EXCEPTIONS)
    return params


# --------------------------------------------------------------------------- statement shapes


class Shape(NamedTuple):
    """What decides a listing statement's text (never a value: values are parameters)."""

    cols: tuple[str, ...]      # session columns shown, in model order
    activity: bool             # the file has last_activity_at
    prompts: bool              # resolve system_prompt through system_prompts in the statement
    chain: bool                # order_by_last_active
    children: bool             # include_children (no marker test on the listed rows)
    markers: bool              # the statement needs the marker exceptions
    project: bool              # project compression tips
    include: bool = False
    exclude: bool = False
    cwd: int = 0               # 0: no filter, 1: the condition, 2: the file has no cwd (nothing matches)
    least: bool = False
    archived: str = ""         # "only", "hide", "none" (asked for archived only, no column) or ""
    ids_needle: bool = False
    text_needle: bool = False
    squeezed: bool = False
    session_key: bool = False  # the session_key filter (v26)
    hidden: bool = False       # leave out hidden rows (v25; the listing, never the counts)
    pinned: bool = False       # pinned rows only (include_pinned's second read)
    reset: bool = False        # the file has a parent's session_key and end reason to tell reset children by
    by_source: bool = False    # counts per source (session_count_by_source)
    straight: bool = False     # walk plain chains to their tip in SQL (a page of many rows)


def _full_columns(f: Any, cols: Sequence[str], activity: bool, prompts: bool, *, outer: bool = False) -> list[Any]:
    """The session columns of ``f`` (the prompt text resolved when ``prompts``), then the
    preview's source and last_active.

    ``outer``: ``f`` is outer-joined, NULL on most rows (the walk's nodes); the two
    lookups in ``messages`` then run only where ``f`` is a row (a CASE evaluates its
    branch only when taken: on the 10k bench listing, 1,100 of its 1,550 rows are nodes
    of one chain, and their lookups were half of the statement's execution)."""
    out = [
        func.coalesce(_SP.c.prompt, f.c.system_prompt).label("system_prompt")
        if prompts and name == "system_prompt" else f.c[name]
        for name in cols
    ]
    preview, recency = _preview_source(f), last_active(f, activity)
    if outer:
        present = f.c.id.is_not(None)
        preview, recency = case((present, preview), else_=null()), case((present, recency), else_=null())
    return [*out, preview.label("_preview"), recency.label("last_active")]


def _with_prompts(frm: Any, f: Any, prompts: bool) -> Any:
    return frm.outerjoin(_SP, _SP.c.hash == f.c.system_prompt_hash) if prompts else frm


def _filters(s: Any, p: Any, shape: Shape) -> list[ColumnElement[bool]]:
    """Hermes v23's listing filters on ``s`` (``p``: its parent, outer-joined)."""
    conds: list[ColumnElement[bool]] = []
    if shape.include:
        conds.append(s.c.source.in_(_INCLUDE))
    if shape.exclude:
        conds.append(s.c.source.not_in(_EXCLUDE))
    if shape.cwd == 1:  # housekeeping.cwd_prefix_condition, its values as parameters
        conds.append(or_(
            s.c.cwd == _CWD,
            *(func.substr(s.c.cwd, 1, func.length(b)) == b for b in (_CWD_SLASH, _CWD_BACKSLASH)),
        ))
    elif shape.cwd == 2:
        conds.append(false())
    if shape.least:
        conds.append(s.c.message_count >= _LEAST)
    if shape.session_key:
        conds.append(s.c.session_key == _SESSION_KEY)
    # "NULL or 0" spelled out, not as coalesce(x, 0) = 0: the same rows, but a planner
    # reads the column's statistics for it. PostgreSQL took coalesce(...) = 0 for a 0.5%
    # guess, expected one listable row, and sorted every session instead of walking the
    # started_at index to the page (10k bench: 6.4 ms of execution, now 1.2).
    if shape.hidden:
        conds.append(or_(s.c.hidden.is_(None), s.c.hidden == 0))
    if shape.pinned:
        conds.append(s.c.pinned != 0)  # NULL is not pinned, as coalesce(pinned, 0) != 0 said
    if shape.archived == "only":
        conds.append(s.c.archived != 0)
    elif shape.archived == "hide":
        conds.append(or_(s.c.archived.is_(None), s.c.archived == 0))
    elif shape.archived == "none":
        conds.append(false())
    if not shape.children:
        listable = or_(
            s.c.parent_session_id.is_(None),
            p.c.id.is_(None),  # the parent row is gone: nothing to hang it under
            _has(s, BRANCH_MARKER),
            and_(p.c.end_reason == "branched", p.c.ended_at.is_not(None), s.c.started_at >= p.c.ended_at),
            *_reset_child(s, p, shape),
        )
        conds.append(and_(listable, _lacks(s, DELEGATE_MARKER)))
    return conds


def _reset_child(s: Any, p: Any, shape: Shape) -> list[ColumnElement[bool]]:
    """Hermes v26 §5.2: a reset child (``_reset_from`` in its config, or the legacy
    shape: its parent's non-empty session_key while the parent ended for a reset) is
    listed on its own."""
    marked = s.c.model_config.like(_contains(RESET_MARKER), escape="\\")
    if not shape.reset:
        return [marked]
    legacy = and_(func.coalesce(s.c.session_key, "") != "", s.c.session_key == p.c.session_key,
                  p.c.end_reason.in_(RESET_END_REASONS))
    return [marked, legacy]


def _page(shape: Shape) -> Select[Any, Any, Any]:
    """``(id, end_reason, rn)`` of the page's rows, ``rn`` their place in the page order
    (newest first): the listing statement returns its rows unordered (sorting 500 rows
    of 70 columns was a tenth of its execution) and Python orders the page by ``rn``."""
    s, p = _LISTED, _PARENT
    conds = _filters(s, p, shape)
    base = s.outerjoin(p, p.c.id == s.c.parent_session_id)
    order: tuple[Any, ...]
    if not shape.chain:
        order = (s.c.started_at.desc(), s.c.id.desc())
        stmt = select(s.c.id, s.c.end_reason, func.row_number().over(order_by=order).label("rn")) \
            .select_from(base).where(*conds)
    else:
        ranked = _ranked(s, base, conds, shape)
        t = _ROW
        order = (ranked.c.chain_last.desc(), t.c.started_at.desc(), t.c.id.desc())
        stmt = select(t.c.id, t.c.end_reason, func.row_number().over(order_by=order).label("rn")) \
            .join_from(ranked, t, t.c.id == ranked.c.root_id)
    return stmt.order_by(*order).limit(_LIMIT).offset(_OFFSET)


def _ranked(s: Any, base: Any, conds: list[ColumnElement[bool]], shape: Shape) -> Any:
    """``(root_id, chain_last)`` per listed row: the newest activity of its compression
    chain, only the chains the needles match."""
    roots = select(s.c.id.label("root_id"), s.c.end_reason.label("end_reason"), s.c.id.label("id")) \
        .select_from(base).where(*conds).cte("roots")
    chain = compression_chains(roots, _CHILD, _lacks(_CHILD, BRANCH_MARKER), _lacks(_CHILD, DELEGATE_MARKER))
    mem = _MEMBER
    stats = (
        select(chain.c.root_id, func.max(last_active(mem, shape.activity)).label("chain_last"))
        .join_from(chain, mem, mem.c.id == chain.c.id)
        .group_by(chain.c.root_id)
    )
    if shape.ids_needle:
        stats = stats.having(func.max(case(
            (func.lower(mem.c.id).like(_IDS_PAT, escape="\\"), 1), else_=0)) == 1)
    if shape.text_needle:
        title = func.lower(mem.c.title)
        hits = [title.like(_TEXT_PAT, escape="\\"), func.lower(mem.c.id).like(_TEXT_PAT, escape="\\")]
        if shape.squeezed:
            hits.append(_compact(title).like(_SQUEEZED_PAT, escape="\\"))
        stats = stats.having(func.max(case((or_(*hits), 1), else_=0)) == 1)
    return stats.subquery("ranked")


@functools.cache
def _listing_stmt(shape: Shape) -> Select[*tuple[Any, ...]]:
    """One statement for a whole listing page (see the module docstring).

    Rows ``(kind, <the 9 node columns of lineage.Graph>, <full columns>)``: the page's
    rows (kind PAGE, full columns, in page order), the page's forward compression
    subgraph (kind NODE; full columns only for the sessions that can end a walk: those
    without a child the walk surely takes, i.e. a non-tool child with no marker
    substring at all), and the marker rows to check (kind MARKED).
    """
    page = _page(shape).cte("pg")
    no_root = cast(null(), String).label("root")
    no_rn = cast(null(), BigInteger)
    parts = [select(page.c.id, literal_column(str(PAGE), Integer).label("kind"), page.c.rn,
                    literal_column("1", Integer).label("full"), no_root)]
    if shape.project:
        compressed = select(page.c.id, page.c.end_reason).where(page.c.end_reason == COMPRESSION)
        if shape.straight:
            # Chains without a choice are walked in SQL: only their tip comes back (kind
            # TIP, full columns, its root named); the others bring their forward subgraph.
            ends = straight_ends(compressed.subquery("pgc"), "lsw")
            parts.append(select(ends.c.id, literal_column(str(TIP), Integer), no_rn, literal_column("1", Integer),
                                ends.c.root)
                         .where(ends.c.sure == 1, ends.c.depth > 0))
            compressed = select(ends.c.root.label("id"),
                                literal_column(f"'{COMPRESSION}'", String).label("end_reason")).where(ends.c.sure == 0)
        fwd = _forward(compressed, "lfwd")
        c = _CAND
        clean = or_(c.c.model_config.is_(None), and_(not_(c.c.model_config.like(f"%{BRANCH_MARKER}%")),
                                                      not_(c.c.model_config.like(f"%{DELEGATE_MARKER}%"))))
        goes_on = and_(fwd.c.end_reason == COMPRESSION,
                       exists().where(c.c.parent_session_id == fwd.c.id, c.c.source != "tool", clean))
        parts.append(select(fwd.c.id, literal_column(str(NODE), Integer), no_rn, case((goes_on, 0), else_=1),
                            no_root))
    if shape.markers:
        scope = _marker_scope().subquery("mks")
        parts.append(select(scope.c.id, literal_column(str(MARKED), Integer), no_rn, literal_column("0", Integer),
                            no_root))
    want = union_all(*parts).subquery("want")
    n, f = _NODE, _FULL
    frm = want.join(n, n.c.id == want.c.id).outerjoin(f, and_(f.c.id == want.c.id, want.c.full == 1))
    frm = _with_prompts(frm, f, shape.prompts)
    is_node = want.c.kind == NODE
    newest = select(func.max(_M.c.timestamp)).where(_M.c.session_id == n.c.id).correlate(n).scalar_subquery()
    node = [
        want.c.kind, *link_columns(n),
        case((want.c.kind != PAGE, marker_text(n)), else_=null()).label("markers"),
        case((is_node, newest), else_=null()).label("activity"),
        cast(null(), Integer).label("has_messages"),
    ]
    return select(*node, *_full_columns(f, shape.cols, shape.activity, shape.prompts, outer=True), want.c.root,
                  want.c.rn).select_from(frm)


@functools.cache
def _count_stmt(shape: Shape) -> Select[Any, Any, Any, Any] | CompoundSelect[Any, Any, Any, Any]:
    """``(COUNTED, count, NULL, NULL)`` (``by_source``: ``(COUNTED, count, source, NULL)``
    per source) and, when children are excluded,
    ``(MARKED, NULL, id, model_config)`` per marker row to check: one statement."""
    s, p = _LISTED, _PARENT
    conds = _filters(s, p, shape)
    frm = s.outerjoin(p, p.c.id == s.c.parent_session_id) if not shape.children else s
    if shape.by_source:
        counted = select(literal_column(str(COUNTED), Integer).label("kind"), func.count().label("n"),
                         s.c.source.label("id"), cast(null(), String).label("config")) \
            .select_from(frm).where(*conds).group_by(s.c.source)
    else:
        counted = select(literal_column(str(COUNTED), Integer).label("kind"), func.count().label("n"),
                         cast(null(), String).label("id"), cast(null(), String).label("config")) \
            .select_from(frm).where(*conds)
    if not shape.markers:
        return counted
    scope = _marker_scope().subquery("mks")
    return union_all(counted, select(literal_column(str(MARKED), Integer), cast(null(), Integer), scope.c.id,
                                     scope.c.model_config))


@functools.cache
def _rows_stmt(cols: tuple[str, ...], activity: bool, prompts: bool, where: str) -> Select[*tuple[Any, ...]]:
    """Full listing rows: of ``:ids`` (``where='ids'``) or of one cron job (``'cron'``)."""
    t = _ROW
    stmt = select(*_full_columns(t, cols, activity, prompts)).select_from(_with_prompts(t, t, prompts))
    if where == "ids":
        return stmt.where(t.c.id.in_(IDS))
    return (
        stmt.where(t.c.source == "cron", func.substr(t.c.id, 1, func.length(_PREFIX)) == _PREFIX)
        .order_by(t.c.started_at.desc(), t.c.id.desc())
        .limit(_LIMIT).offset(_OFFSET)
    )


# --------------------------------------------------------------------------- repository


class ListingRepository(Repository):
    """Read-only: every statement here is a SELECT."""

    # ------------------------------------------------------------------ helpers

    @property
    def _has_activity(self) -> bool:
        return "last_activity_at" in self.columns_of("sessions")

    def _cols(self, compact: bool) -> tuple[str, ...]:
        present = self.columns_of("sessions")
        return tuple(c.name for c in _S.columns
                     if c.name in present and not (compact and c.name in COMPACT_DROPS))

    def _prompts_in_sql(self, cols: Sequence[str]) -> bool:
        """Whether the statement itself resolves the prompt (``COALESCE(prompt, system_prompt)``)."""
        return "system_prompt" in cols and "system_prompt_hash" in cols and self.has_table("system_prompts")

    @staticmethod
    def _record(cols: Sequence[str], values: Sequence[Any]) -> SessionRecord:
        """A listing row: the columns, then last_active and preview (Hermes' key order)."""
        n = len(cols)
        item: dict[str, Any] = dict(zip(cols, values[:n], strict=True))
        item["last_active"] = values[n + 1]
        item["preview"] = make_preview(values[n])
        return item  # type: ignore[return-value]

    def _resolve(self, rows: list[SessionRecord], compact: bool, prompts: bool) -> None:
        if not compact and not prompts:
            self._peer(SessionRepository).resolve_prompts(rows)  # type: ignore[arg-type]

    def _rows_by_id(self, ids: Sequence[str], compact: bool) -> dict[str, SessionRecord]:
        cols = self._cols(compact)
        prompts = not compact and self._prompts_in_sql(cols)
        stmt = _rows_stmt(cols, self._has_activity, prompts, "ids")
        found: list[SessionRecord] = []
        for start in range(0, len(ids), ID_CHUNK):
            found += [self._record(cols, r) for r in
                      self.conn.execute(stmt, {"ids": list(ids[start:start + ID_CHUNK])}).fetchall()]
        self._resolve(found, compact, prompts)
        return {r["id"]: r for r in found}

    def _filter_params(
        self, *, source: Any, exclude_sources: Any, cwd_prefix: Any, min_message_count: Any,
        include_archived: bool, archived_only: bool, sources: Any = None, session_key: Any = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(shape fields, params)`` of Hermes v26's listing filters (``source``, else
        ``sources``; ``session_key`` exact)."""
        present = self.columns_of("sessions")
        fields: dict[str, Any] = {"reset": "session_key" in present}
        params: dict[str, Any] = {}
        include, exclude = _listed(source) or _listed(sources), _listed(exclude_sources)
        if session_key is not None:
            if not isinstance(session_key, str):
                raise errors.InvalidInputError(f"session_key must be a string, not {type(session_key).__name__}")
            if "session_key" in present:
                fields["session_key"], params["session_key"] = True, clean_text(session_key)
            else:
                fields["cwd"] = 2  # no such column: nothing matches
        if include:
            fields["include"], params["inc"] = True, include
        if exclude:
            fields["exclude"], params["exc"] = True, exclude
        if cwd_prefix:
            if not isinstance(cwd_prefix, str):
                raise errors.InvalidInputError(f"cwd_prefix must be a string, not {type(cwd_prefix).__name__}")
            if "cwd" in present:
                base = clean_text(cwd_prefix).rstrip("/\\")
                fields["cwd"] = 1
                params.update(cwd=base, cwd_slash=base + "/", cwd_backslash=base + "\\")
            else:
                fields["cwd"] = 2
        least = _count_arg(min_message_count, "min_message_count")
        if least > 0:
            fields["least"], params["least"] = True, least
        if "archived" in present:
            if archived_only:
                fields["archived"] = "only"
            elif not include_archived:
                fields["archived"] = "hide"
        elif archived_only:
            fields["archived"] = "none"
        return fields, params

    def _run(self, stmt: Executable, params: dict[str, Any], markers: bool, kind: int, mid: int,
             config: int) -> Sequence[Any]:
        """Run a statement that carries its marker rows; again, naming the exceptions, when
        any of those rows turns out not to carry its marker."""
        params.update(_exception_params())
        # the driver's tuples: no listing column needs SQLAlchemy's result processing
        rows = fetch_tuples(self.conn.execute(stmt, params))
        if not markers:
            return rows
        found = exceptions_of((r[mid], r[config]) for r in rows if r[kind] == MARKED)
        if any(found.values()):
            params.update(_exception_params(found))
            rows = fetch_tuples(self.conn.execute(stmt, params))
        return rows

    # ------------------------------------------------------------------ list_sessions_rich

    def list_rich(
        self,
        source: str | Iterable[str] | None = None,
        sources: Iterable[str] | None = None,
        exclude_sources: Iterable[str] | None = None,
        cwd_prefix: str | None = None,
        limit: int = 20,
        offset: int = 0,
        include_children: bool = False,
        min_message_count: int = 0,
        project_compression_tips: bool = True,
        order_by_last_active: bool = False,
        include_archived: bool = False,
        archived_only: bool = False,
        id_query: str | None = None,
        search_query: str | None = None,
        compact_rows: bool = False,
        include_pinned: bool = False,
        session_key: str | None = None,
        include_hidden: bool = False,
    ) -> list[SessionRecord]:
        """Hermes v26 ``list_sessions_rich`` (see the module docstring for lineage rules).

        Without ``order_by_last_active``: newest start first (id breaks ties). With it:
        by the latest activity anywhere in each row's compression chain, then start and
        id; only then are ``id_query`` / ``search_query`` applied (a row is kept when
        any session of its chain matches). A listed session that ended 'compression'
        is shown as its chain's tip: the tip's TIP_COLUMNS over the row, and
        ``_lineage_root_id`` naming the listed session. Hidden rows are left out unless
        ``include_hidden``; ``include_pinned`` appends the pinned rows (same filters)
        the page lacks. Every row gets ``unread``. One statement (see the module
        docstring for the rare second one), one more for ``include_pinned``.
        """
        limit_n, offset_n = _count_arg(limit, "limit"), _count_arg(offset, "offset")
        compact = bool(compact_rows)
        children = bool(include_children)
        project = bool(project_compression_tips) and not children
        chain = bool(order_by_last_active)
        ids_needle = _needle(id_query) if chain else ""
        text_needle = _needle(search_query) if chain else ""
        if not limit_n and not include_pinned:
            return []
        fields, params = self._filter_params(
            source=source, sources=sources, exclude_sources=exclude_sources, cwd_prefix=cwd_prefix,
            min_message_count=min_message_count, include_archived=include_archived, archived_only=archived_only,
            session_key=session_key,
        )
        present = self.columns_of("sessions")
        if not include_hidden and "hidden" in present:
            fields["hidden"] = True
        if ids_needle:
            fields["ids_needle"], params["ids_pat"] = True, _contains(ids_needle)
        if text_needle:
            fields["text_needle"], params["text_pat"] = True, _contains(text_needle)
            squeezed = _COMPACT_RE.sub("", text_needle)
            if squeezed:
                fields["squeezed"], params["squeezed_pat"] = True, _contains(squeezed)
        page = self._page_rows(fields, dict(params, limit=limit_n, offset=offset_n), compact, children,
                               project, chain) if limit_n else []
        if include_pinned and "pinned" in present:
            listed = {r["id"] for r in page} | {r["_lineage_root_id"] for r in page if "_lineage_root_id" in r}
            pinned = self._page_rows(dict(fields, pinned=True), dict(params, limit=MAX_ROWS, offset=0), compact,
                                     children, project, chain)
            page += [r for r in pinned if r["id"] not in listed and r.get("_lineage_root_id", r["id"]) not in listed]
        for row in page:
            row["unread"] = session_unread(row)  # type: ignore[typeddict-unknown-key]
        return page

    def _page_rows(self, fields: dict[str, Any], params: dict[str, Any], compact: bool, children: bool,
                   project: bool, chain: bool) -> list[SessionRecord]:
        """One listing statement's page, tips projected."""
        cols = self._cols(compact)
        prompts = not compact and self._prompts_in_sql(cols)
        markers = not children or chain
        shape = Shape(cols, self._has_activity, prompts, chain, children, markers, project, **fields,
                      straight=project and params["limit"] > STRAIGHT_WALK_FROM)
        rows = self._run(_listing_stmt(shape), params, markers, 0, 1, 7)
        page = [self._record(cols, r[_FULL_AT:]) for r in sorted((r for r in rows if r[0] == PAGE), key=_BY_RN)]
        if project:
            self._project_tips(page, [r for r in rows if r[0] == NODE], compact, prompts,
                               [r for r in rows if r[0] == TIP])
        else:
            self._resolve(page, compact, prompts)
        return page

    def _project_tips(self, page: list[SessionRecord], nodes: list[Any], compact: bool, prompts: bool,
                      ends: Sequence[Any] = ()) -> None:
        """Show each listed session that ended 'compression' as its chain's tip (in place):
        the tip the statement walked to (``ends``: TIP rows, root next to last), else where
        :class:`.lineage.Graph` walks the ``nodes``."""
        compressed = [r["id"] for r in page if r.get("end_reason") == COMPRESSION]
        walked = {r[-2]: r[1] for r in ends}
        tips: dict[str, str] = {}
        if compressed:
            graph = Graph(nodes) if nodes else None
            for sid in compressed:
                tip = walked.get(sid) or (graph.tip(sid) if graph is not None else sid)
                if tip != sid:
                    tips[sid] = tip
        cols = self._cols(compact)
        at = _FULL_AT + cols.index("id")
        tip_rows = {r[1]: self._record(cols, r[_FULL_AT:]) for r in (*ends, *nodes)
                    if r[1] in tips.values() and r[at] is not None} if tips else {}
        self._resolve(page + list(tip_rows.values()), compact, prompts)
        missing = sorted(set(tips.values()) - set(tip_rows))
        if missing:  # a tip the statement did not expect (a corrupt cycle)
            tip_rows.update(self._rows_by_id(missing, compact))
        for row in page:
            tip_row = tip_rows.get(tips.get(row["id"], ""))
            if tip_row is None:
                continue
            root = row["id"]
            # TIP_COLUMNS are SessionRecord keys named at run time: copied as a plain mapping.
            shown, shown_tip = typing.cast(dict[str, Any], row), typing.cast(dict[str, Any], tip_row)
            for key in TIP_COLUMNS:
                if key in shown_tip:
                    shown[key] = shown_tip[key]
            row["_lineage_root_id"] = root

    # ------------------------------------------------------------------ counts and lookups

    def count(
        self,
        source: str | Iterable[str] | None = None,
        sources: Iterable[str] | None = None,
        cwd_prefix: str | None = None,
        min_message_count: int = 0,
        include_archived: bool = False,
        archived_only: bool = False,
        exclude_children: bool = False,
        exclude_sources: Iterable[str] | None = None,
    ) -> int:
        """Hermes v26 ``session_count``: the listing's filters (hidden rows counted), no
        projection (a chain counts once, through its root, when children are excluded).
        One statement."""
        return sum(self._counts(source, sources, cwd_prefix, min_message_count, include_archived, archived_only,
                                exclude_children, exclude_sources, by_source=False).values())

    def count_by_source(self, include_archived: bool = False, archived_only: bool = False,
                        exclude_children: bool = False) -> dict[str, int]:
        """Hermes v26 ``session_count_by_source``: the same counts per source (a missing
        or empty source is 'cli'). One statement."""
        return self._counts(None, None, None, 0, include_archived, archived_only, exclude_children, None,
                            by_source=True)

    def _counts(self, source: Any, sources: Any, cwd_prefix: Any, min_message_count: Any, include_archived: bool,
                archived_only: bool, exclude_children: bool, exclude_sources: Any, *, by_source: bool
                ) -> dict[str, int]:
        fields, params = self._filter_params(
            source=source, sources=sources, exclude_sources=exclude_sources, cwd_prefix=cwd_prefix,
            min_message_count=min_message_count, include_archived=include_archived, archived_only=archived_only,
        )
        markers = bool(exclude_children)
        shape = Shape((), False, False, False, not markers, markers, False, by_source=by_source, **fields)
        rows = self._run(_count_stmt(shape), params, markers, 0, 2, 3)
        out: dict[str, int] = {}
        for r in rows:
            if r[0] == COUNTED:
                name = r[2] or "cli"
                out[name] = out.get(name, 0) + int(r[1] or 0)
        return out

    def count_at_least(self, n: Any) -> bool:
        """Whether the store holds at least ``n`` sessions of any kind (reads at most ``n`` ids)."""
        wanted = _count_arg(n, "n")
        if wanted <= 0:
            return True
        return self.conn.execute(select(_S.c.id).limit(1).offset(wanted - 1)).first() is not None

    def cron_job_runs(self, job_id: Any, limit: int = 20, offset: int = 0) -> list[SessionRecord]:
        """Runs of one cron job: ``source='cron'`` sessions whose id starts ``cron_<job_id>_``.

        Hermes selects the id range [prefix, prefix with its last character + 1); under
        code-point order that is exactly "starts with the prefix", which is compared
        here directly so a PostgreSQL collation cannot reorder the range. Newest first;
        no child, archive or chain handling.
        """
        cols = self._cols(False)
        prompts = self._prompts_in_sql(cols)
        params = {"prefix": clean_text(f"cron_{job_id}_"), "limit": _count_arg(limit, "limit"),
                  "offset": _count_arg(offset, "offset")}
        rows = [self._record(cols, r) for r in
                self.conn.execute(_rows_stmt(cols, self._has_activity, prompts, "cron"), params).fetchall()]
        self._resolve(rows, False, prompts)
        return rows

    def search_by_id(self, query: Any, limit: Any = 20, include_archived: bool = True, source: Any = None,
                     sources: Any = None, exclude_sources: Any = None) -> list[SessionRecord]:
        """Hermes v26 ``search_sessions_by_id``: chains whose ids contain the query, exact
        matches (the row's id or its chain root's) first, then prefixes, then the rest;
        stable within each group (most recent activity first); the listing's source filters."""
        needle = _needle(query) if query is not None else ""
        n = _count_arg(limit, "limit")
        if not needle or n <= 0:
            return []
        rows = self.list_rich(source=source, sources=sources, exclude_sources=exclude_sources,
                              limit=max(4 * n, n), include_archived=include_archived,
                              order_by_last_active=True, id_query=needle)

        def rank(row: SessionRecord) -> int:
            ids = [str(x).lower() for x in (row.get("id"), row.get("_lineage_root_id")) if x]
            if needle in ids:
                return 0
            return 1 if any(i.startswith(needle) for i in ids) else 2

        return sorted(rows, key=rank)[:n]

    def search(self, source: str | Iterable[str] | None = None, limit: int = 20, offset: int = 0,
               workspace_key: str | None = None) -> list[SessionRecord]:
        """``search_sessions``: every session (children and archived too), most recent
        activity first (then start, then id). ``workspace_key``: sessions of that
        repository root, or without a root whose cwd is the key or below it."""
        t = _ROW
        include = _listed(source)
        activity = last_active(t, self._has_activity).label("last_active")
        present = self.columns_of("sessions")
        stmt = select(*(t.c[c.name] for c in _S.columns if c.name in present), activity)
        params: dict[str, Any] = {}
        if include:
            stmt = stmt.where(t.c.source.in_(include))
        if workspace_key:
            if not isinstance(workspace_key, str):
                raise errors.InvalidInputError(f"workspace_key must be a string, not {type(workspace_key).__name__}")
            key = clean_text(workspace_key).rstrip("/\\") or clean_text(workspace_key)
            params.update(ws=key, ws_slash=key.rstrip("/") + "/")
            under = or_(t.c.cwd == _WORKSPACE,
                        func.substr(t.c.cwd, 1, func.length(_WORKSPACE_SLASH)) == _WORKSPACE_SLASH)
            stmt = stmt.where(or_(t.c.git_repo_root == _WORKSPACE,
                                  and_(func.coalesce(t.c.git_repo_root, "") == "", under)))
        stmt = stmt.order_by(activity.desc(), t.c.started_at.desc(), t.c.id.desc()) \
            .limit(_count_arg(limit, "limit")).offset(_count_arg(offset, "offset"))
        rows = [dict(r) for r in self.conn.execute(stmt, params).mappings()]
        self._peer(SessionRepository).resolve_prompts(rows)
        return rows  # type: ignore[return-value]

    def rich_row(self, session_id: str, compact: bool = False) -> SessionRecord | None:
        """One session as the listing shows it (row, preview, last_active); None when unknown."""
        if not isinstance(session_id, str):
            return None
        return self._rows_by_id([session_id], bool(compact)).get(session_id)

    def rich_rows(self, session_ids: Iterable[Any], compact: bool = False) -> dict[str, SessionRecord]:
        """Several sessions as the listing shows them, in one batch: id -> row (unknown
        and non-str ids left out)."""
        ids = list(dict.fromkeys(i for i in session_ids if isinstance(i, str)))
        return self._rows_by_id(ids, bool(compact)) if ids else {}

    def skill_scaffolded(self, limit: Any = 200) -> list[dict[str, Any]]:
        """Titled sessions whose first user turn invokes a skill: ``{id, title, content}``,
        newest first."""
        t = _ROW
        first = _first_user_content(t).label("content")
        inner = select(t.c.id, t.c.title, t.c.started_at, first) \
            .where(func.coalesce(t.c.title, "") != "").subquery("titled")
        stmt = select(inner.c.id, inner.c.title, inner.c.content) \
            .where(inner.c.content.like(escape_like(SKILL_INVOCATION_PREFIX) + "%", escape="\\")) \
            .order_by(inner.c.started_at.desc(), inner.c.id.desc()).limit(_count_arg(limit, "limit"))
        return [{"id": i, "title": title, "content": content} for i, title, content in self.conn.execute(stmt)]

    def first_assistant_text(self, session_id: Any) -> str:
        """The text of the session's first live assistant turn that has any ('' if none)."""
        if not isinstance(session_id, str) or not session_id:
            return ""
        stmt = select(_M.c.content).where(_M.c.session_id == session_id, _M.c.role == "assistant",
                                         _M.c.active == 1, _M.c.content.is_not(None), _M.c.content != "") \
            .order_by(_M.c.timestamp, _M.c.id)
        for (content,) in self.conn.execute(stmt.limit(_SCAN_ROWS)):
            text = _plain_text(content)
            if text.strip():
                return text
        return ""


def session_unread(row: Any) -> bool:
    """Hermes v25 ``session_unread``: never read (``last_read_at`` None) is not unread;
    else whether the session moved (``last_active``, else its start) after the read."""
    if not isinstance(row, dict):
        return False
    read = row.get("last_read_at")
    if read is None:
        return False
    moved = row.get("last_active") or row.get("started_at")
    try:
        return moved is not None and float(moved) > float(read)
    except (TypeError, ValueError):
        return False


def _plain_text(content: Any) -> str:
    value = decode_content(content)
    if isinstance(value, list):
        return " ".join(p["text"] for p in value if isinstance(p, dict) and isinstance(p.get("text"), str))
    return value if isinstance(value, str) else ""


__all__ = ["ListingRepository", "Shape", "exceptions_of", "last_active", "make_preview",
           "session_unread"]
