"""Listing and counting sessions (Hermes v23 ``list_sessions_rich``, ``session_count``,
``list_cron_job_runs``, ``search_sessions_by_id``, ``search_sessions``).

SQLAlchemy Core against the model tables, the same statements on SQLite and PostgreSQL.

Lineage markers. Which children are listed, and which children continue a compression
chain, depends on the ``_branched_from`` / ``_delegate_from`` keys inside the
``model_config`` JSON. PostgreSQL cannot test those in SQL without failing on a row
whose JSON is malformed, so, as in :mod:`.lineage`, they are decided in Python with
:func:`.lineage._marker`: a substring ``LIKE`` finds every row that may carry a
marker, and the few such rows that do not really carry it (malformed JSON, a JSON null,
a nested key, the words inside a string) are read once per call and named in the
statement as exceptions. Only the rows where a marker can change the answer are read:
children (branch marker), and for the delegate marker roots, children of a
'compression' or 'branched' parent and branch-marked rows.

Compression chains (Hermes v23 forward edge, no timestamp condition): parent
``end_reason='compression'`` → child that is not a tool run, not a branch and not a
delegate. Ordering by chain activity and the ``id_query`` / ``search_query`` filters
use every session reachable that way (a recursive UNION, so a corrupt cycle ends by
itself); the projected tip is where :class:`.lineage.Graph` walks, Hermes' per-step
preference order (the same rule as ``get_compression_tip``).
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Sequence

from sqlalchemy import and_, case, exists, false, func, literal, not_, or_, select, union_all
from sqlalchemy.sql import ColumnElement, Select
from sqlalchemy.sql.selectable import Alias

from .. import errors
from ..codec import clean_text, decode_content
from .base import ID_CHUNK, MESSAGES, SESSIONS, Repository
from .housekeeping import cwd_prefix_condition, like_escape
from .lineage import BRANCH_MARKER, COMPRESSION, DELEGATE_MARKER, Graph, _forward, _marker, _nodes, _seed
from .records import SessionRecord
from .sessions import SessionRepository

PREVIEW_CHARS = 60
#: Larger limits/offsets mean "everything"; clamped so both databases can bind them.
MAX_ROWS = 2**62
#: What a projected compression tip brings to its chain's row (Hermes v23), plus the
#: v25 companions of two of them (where the prompt is stored, who set the title).
TIP_COLUMNS = (
    "id", "ended_at", "end_reason", "message_count", "tool_call_count", "title", "last_active", "preview",
    "model", "system_prompt", "cwd", "git_branch", "git_repo_root", "system_prompt_hash", "title_source",
)
#: Characters ``search_query`` ignores when comparing with a title ("my-app" finds "My App").
_COMPACT = ("-", "_", ".", " ")
_COMPACT_RE = re.compile("[" + re.escape("".join(_COMPACT)) + "]")

_S = SESSIONS
_M = MESSAGES
#: Aliases built once: each one's column collection (60-odd proxies) costs milliseconds.
_LISTED, _PARENT = _S.alias("s"), _S.alias("p")
_MARKED, _MARKED_PARENT = _S.alias("mk"), _S.alias("mk_p")
_ROW, _CHILD, _MEMBER = _S.alias("t"), _S.alias("chain_c"), _S.alias("mem")


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
    return f"%{like_escape(needle)}%"


def make_preview(content: Any) -> str:
    """First user message, newlines folded, cut to 60 characters plus '...'."""
    value = decode_content(content) if isinstance(content, str) else content
    if value is None:
        return ""
    if not isinstance(value, str):
        parts = [p.get("text", "") for p in value if isinstance(p, dict)] if isinstance(value, list) else []
        value = " ".join(x for x in parts if isinstance(x, str) and x)
    text = re.sub(r"[\r\n]+", " ", value).strip()
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
        .scalar_subquery()
    )


def _compact(expr: ColumnElement[Any]) -> ColumnElement[Any]:
    for ch in _COMPACT:
        expr = func.replace(expr, ch, "")
    return expr


class Markers:
    """Exact SQL tests of the lineage markers, for the rows a listing can be changed by.

    ``has(t, key)``: ``model_config`` holds the key as a substring and the row is not
    one of the exceptions read in Python (substring present, marker absent).
    """

    def __init__(self, exceptions: dict[str, set[str]]) -> None:
        self.exceptions = exceptions

    def has(self, t: Any, key: str) -> ColumnElement[bool]:
        cond = t.c.model_config.like(_contains(key), escape="\\")
        exc = sorted(self.exceptions.get(key, ()))
        return and_(cond, t.c.id.not_in(exc)) if exc else cond

    def lacks(self, t: Any, key: str) -> ColumnElement[bool]:
        cond = or_(t.c.model_config.is_(None), not_(t.c.model_config.like(_contains(key), escape="\\")))
        exc = sorted(self.exceptions.get(key, ()))
        return or_(cond, t.c.id.in_(exc)) if exc else cond


# --------------------------------------------------------------------------- repository


class ListingRepository(Repository):
    """Read-only: every statement here is a SELECT."""

    # ------------------------------------------------------------------ helpers

    @property
    def _has_activity(self) -> bool:
        return "last_activity_at" in self.columns_of("sessions")

    def _row_columns(self, t: Any, compact: bool) -> list[Any]:
        """The session columns (as the file has them), then preview and last_active."""
        present = self.columns_of("sessions")
        cols = [t.c[c.name] for c in _S.columns if c.name in present and not (compact and c.name == "system_prompt")]
        activity = last_active(t, self._has_activity).label("last_active")
        return cols + [_first_user_content(t).label("_preview"), activity]

    def _rows(self, stmt: Select, compact: bool) -> list[SessionRecord]:
        out: list[SessionRecord] = []
        for row in self.conn.execute(stmt).mappings():
            item = dict(row)
            preview = item.pop("_preview")
            item["preview"] = make_preview(preview)
            out.append(item)  # type: ignore[arg-type]
        if not compact:
            SessionRepository(self.conn).resolve_prompts(out)  # type: ignore[arg-type]
        return out

    def _rows_by_id(self, ids: Sequence[str], compact: bool) -> dict[str, SessionRecord]:
        t = _ROW
        found: dict[str, SessionRecord] = {}
        for start in range(0, len(ids), ID_CHUNK):
            chunk = list(ids[start:start + ID_CHUNK])
            stmt = select(*self._row_columns(t, compact)).where(t.c.id.in_(chunk))
            found.update((r["id"], r) for r in self._rows(stmt, compact))
        return found

    def markers(self) -> Markers:
        """Read the rows whose marker substring is not a marker (usually none).

        The substring tests come first, so the parent is looked up only for the rows
        that mention a delegate marker.
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
        stmt = select(s.c.id, mc).where(scope)
        exceptions: dict[str, set[str]] = {BRANCH_MARKER: set(), DELEGATE_MARKER: set()}
        for sid, config in self.conn.execute(stmt):
            for key, found in exceptions.items():
                if not isinstance(config, str):
                    found.add(sid)  # a LIKE may match bytes; they never carry a marker
                elif key.lower() in config.lower() and not _marker(config, key):
                    found.add(sid)
        return Markers(exceptions)

    def _conditions(
        self, s: Any, p: Any, *, source: Any, exclude_sources: Any, cwd_prefix: Any, min_message_count: Any,
        include_archived: bool, archived_only: bool, children: bool, markers: Markers | None,
    ) -> list[ColumnElement[bool]]:
        """Hermes v23's listing filters on ``s`` (``p``: its parent, outer-joined)."""
        present = self.columns_of("sessions")
        conds: list[ColumnElement[bool]] = []
        include, exclude = _listed(source), _listed(exclude_sources)
        if include:
            conds.append(s.c.source.in_(include))
        if exclude:
            conds.append(s.c.source.not_in(exclude))
        if cwd_prefix:
            if not isinstance(cwd_prefix, str):
                raise errors.InvalidInputError(f"cwd_prefix must be a string, not {type(cwd_prefix).__name__}")
            conds.append(cwd_prefix_condition(s.c.cwd, clean_text(cwd_prefix)) if "cwd" in present else false())
        least = _count_arg(min_message_count, "min_message_count")
        if least > 0:
            conds.append(s.c.message_count >= least)
        if "archived" in present:
            if archived_only:
                conds.append(s.c.archived != 0)
            elif not include_archived:
                conds.append(func.coalesce(s.c.archived, 0) == 0)
        elif archived_only:
            conds.append(false())
        if not children:
            assert markers is not None
            listable = or_(
                s.c.parent_session_id.is_(None),
                p.c.id.is_(None),  # the parent row is gone: nothing to hang it under
                markers.has(s, BRANCH_MARKER),
                and_(p.c.end_reason == "branched", p.c.ended_at.is_not(None), s.c.started_at >= p.c.ended_at),
            )
            conds.append(and_(listable, markers.lacks(s, DELEGATE_MARKER)))
        return conds

    # ------------------------------------------------------------------ list_sessions_rich

    def list_rich(
        self,
        source: str | Iterable[str] | None = None,
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
    ) -> list[SessionRecord]:
        """Hermes v23 ``list_sessions_rich`` (see the module docstring for lineage rules).

        Without ``order_by_last_active``: newest start first (id breaks ties). With it:
        by the latest activity anywhere in each row's compression chain, then start and
        id; only then are ``id_query`` / ``search_query`` applied (a row is kept when
        any session of its chain matches). A listed session that ended 'compression'
        is shown as its chain's tip: the tip's TIP_COLUMNS over the row, and
        ``_lineage_root_id`` naming the listed session.
        """
        limit_n, offset_n = _count_arg(limit, "limit"), _count_arg(offset, "offset")
        compact = bool(compact_rows)
        project = bool(project_compression_tips) and not include_children
        ids_needle = _needle(id_query) if order_by_last_active else ""
        text_needle = _needle(search_query) if order_by_last_active else ""
        if not limit_n:
            return []
        markers = self.markers() if not include_children or order_by_last_active else None
        s, p = _LISTED, _PARENT
        conds = self._conditions(
            s, p, source=source, exclude_sources=exclude_sources, cwd_prefix=cwd_prefix,
            min_message_count=min_message_count, include_archived=include_archived,
            archived_only=archived_only, children=bool(include_children), markers=markers,
        )
        base = s.outerjoin(p, p.c.id == s.c.parent_session_id)
        if order_by_last_active:
            assert markers is not None
            stmt = self._by_chain_activity(s, base, conds, markers, ids_needle, text_needle, compact)
        else:
            stmt = (
                select(*self._row_columns(s, compact)).select_from(base).where(*conds)
                .order_by(s.c.started_at.desc(), s.c.id.desc())
            )
        rows = self._rows(stmt.limit(limit_n).offset(offset_n), compact)
        if project:
            self._project_tips(rows, compact)
        return rows

    def _by_chain_activity(
        self, s: Any, base: Any, conds: list[ColumnElement[bool]], markers: Markers, ids_needle: str,
        text_needle: str, compact: bool,
    ) -> Select:
        """Rows ordered by the newest activity of their compression chains (and filtered by them)."""
        roots = select(s.c.id.label("root_id"), s.c.end_reason.label("end_reason"), s.c.id.label("id")) \
            .select_from(base).where(*conds).cte("roots")
        chain = select(roots.c.root_id, roots.c.id, roots.c.end_reason).cte("chain", recursive=True)
        child = _CHILD
        chain = chain.union(
            select(chain.c.root_id, child.c.id, child.c.end_reason)
            .join_from(chain, child, child.c.parent_session_id == chain.c.id)
            .where(
                chain.c.end_reason == COMPRESSION,
                child.c.source != "tool",
                markers.lacks(child, BRANCH_MARKER),
                markers.lacks(child, DELEGATE_MARKER),
            )
        )
        mem = _MEMBER
        stats = (
            select(chain.c.root_id, func.max(last_active(mem, self._has_activity)).label("chain_last"))
            .join_from(chain, mem, mem.c.id == chain.c.id)
            .group_by(chain.c.root_id)
        )
        if ids_needle:
            stats = stats.having(func.max(case(
                (func.lower(mem.c.id).like(_contains(ids_needle), escape="\\"), 1), else_=0)) == 1)
        if text_needle:
            title = func.lower(mem.c.title)
            hits = [title.like(_contains(text_needle), escape="\\"),
                    func.lower(mem.c.id).like(_contains(text_needle), escape="\\")]
            squeezed = _COMPACT_RE.sub("", text_needle)
            if squeezed:
                hits.append(_compact(title).like(_contains(squeezed), escape="\\"))
            stats = stats.having(func.max(case((or_(*hits), 1), else_=0)) == 1)
        ranked = stats.subquery("ranked")
        t = _ROW
        return (
            select(*self._row_columns(t, compact))
            .join_from(ranked, t, t.c.id == ranked.c.root_id)
            .order_by(ranked.c.chain_last.desc(), t.c.started_at.desc(), t.c.id.desc())
        )

    def _project_tips(self, rows: list[SessionRecord], compact: bool) -> None:
        """Show each listed session that ended 'compression' as its chain's tip (in place)."""
        compressed = [r["id"] for r in rows if r.get("end_reason") == COMPRESSION]
        if not compressed:
            return
        tips: dict[str, str] = {}
        for start in range(0, len(compressed), ID_CHUNK):
            chunk = compressed[start:start + ID_CHUNK]
            fwd = _forward(_seed(chunk))
            graph = Graph(self.conn.execute(_nodes(select(fwd.c.id))).fetchall())
            for sid in chunk:
                tip = graph.tip(sid)
                if tip != sid:
                    tips[sid] = tip
        if not tips:
            return
        tip_rows = self._rows_by_id(sorted(set(tips.values())), compact)
        for row in rows:
            tip = tip_rows.get(tips.get(row["id"], ""))  # type: ignore[arg-type]
            if tip is None:
                continue
            root = row["id"]
            for key in TIP_COLUMNS:
                if key in tip:
                    row[key] = tip[key]  # type: ignore[literal-required]
            row["_lineage_root_id"] = root

    # ------------------------------------------------------------------ counts and lookups

    def count(
        self,
        source: str | Iterable[str] | None = None,
        cwd_prefix: str | None = None,
        min_message_count: int = 0,
        include_archived: bool = False,
        archived_only: bool = False,
        exclude_children: bool = False,
        exclude_sources: Iterable[str] | None = None,
    ) -> int:
        """Hermes v23 ``session_count``: the listing's filters, no projection (a chain counts
        once, through its root, when children are excluded)."""
        markers = self.markers() if exclude_children else None
        s, p = _LISTED, _PARENT
        conds = self._conditions(
            s, p, source=source, exclude_sources=exclude_sources, cwd_prefix=cwd_prefix,
            min_message_count=min_message_count, include_archived=include_archived,
            archived_only=archived_only, children=not exclude_children, markers=markers,
        )
        frm = s.outerjoin(p, p.c.id == s.c.parent_session_id) if exclude_children else s
        return int(self.conn.execute(select(func.count()).select_from(frm).where(*conds)).scalar() or 0)

    def cron_job_runs(self, job_id: Any, limit: int = 20, offset: int = 0) -> list[SessionRecord]:
        """Runs of one cron job: ``source='cron'`` sessions whose id starts ``cron_<job_id>_``.

        Hermes selects the id range [prefix, prefix with its last character + 1); under
        code-point order that is exactly "starts with the prefix", which is compared
        here directly so a PostgreSQL collation cannot reorder the range. Newest first;
        no child, archive or chain handling.
        """
        prefix = clean_text(f"cron_{job_id}_")
        t = _ROW
        stmt = (
            select(*self._row_columns(t, False))
            .where(t.c.source == "cron", func.substr(t.c.id, 1, func.length(literal(prefix))) == literal(prefix))
            .order_by(t.c.started_at.desc(), t.c.id.desc())
            .limit(_count_arg(limit, "limit"))
            .offset(_count_arg(offset, "offset"))
        )
        return self._rows(stmt, False)

    def search_by_id(self, query: Any, limit: Any = 20, include_archived: bool = True) -> list[SessionRecord]:
        """Hermes v23 ``search_sessions_by_id``: chains whose ids contain the query, exact
        matches (the row's id or its chain root's) first, then prefixes, then the rest;
        stable within each group (most recent activity first)."""
        needle = _needle(query) if query is not None else ""
        n = _count_arg(limit, "limit")
        if not needle or n <= 0:
            return []
        rows = self.list_rich(limit=max(4 * n, n), include_archived=include_archived,
                              order_by_last_active=True, id_query=needle)

        def rank(row: SessionRecord) -> int:
            ids = [str(x).lower() for x in (row.get("id"), row.get("_lineage_root_id")) if x]
            if needle in ids:
                return 0
            return 1 if any(i.startswith(needle) for i in ids) else 2

        return sorted(rows, key=rank)[:n]

    def search(self, source: str | Iterable[str] | None = None, limit: int = 20, offset: int = 0
               ) -> list[SessionRecord]:
        """``search_sessions``: every session (children and archived too), most recent activity first."""
        t = _ROW
        include = _listed(source)
        activity = last_active(t, self._has_activity).label("last_active")
        present = self.columns_of("sessions")
        stmt = select(*(t.c[c.name] for c in _S.columns if c.name in present), activity)
        if include:
            stmt = stmt.where(t.c.source.in_(include))
        stmt = stmt.order_by(activity.desc(), t.c.id.desc()) \
            .limit(_count_arg(limit, "limit")).offset(_count_arg(offset, "offset"))
        rows = [dict(r) for r in self.conn.execute(stmt).mappings()]
        SessionRepository(self.conn).resolve_prompts(rows)
        return rows  # type: ignore[return-value]

    def rich_row(self, session_id: str) -> SessionRecord | None:
        """One session as the listing shows it (row, preview, last_active); None when unknown."""
        return self._rows_by_id([session_id], False).get(session_id)


__all__ = ["ListingRepository", "Markers", "last_active", "make_preview"]
