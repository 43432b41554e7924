"""Reading commands: sessions, show, lineage, search, stats."""

from __future__ import annotations

import json
import re
from typing import Any
from collections.abc import Callable

import click
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from ..repositories import LineageRepository, SessionRepository
from ..search import query_note
from ._common import (
    LIMIT,
    NONEMPTY,
    OFFSET,
    PROG,
    SORT_CHOICES,
    TEXT,
    USAGE_KEYS,
    read,
    _state,
    content_text,
    fitted_table,
    fmt_ago,
    fmt_compact,
    fmt_cost,
    fmt_num,
    fmt_time,
    highlight_snippet,
    global_options,
    one_line,
    relation,
    resolve,
    session_db,
    sessions_by_id,
    stdout_console,
    table_fits,
)

#: A billing route as shown (``show``'s Billing line, ``stats --by route``'s names).
ROUTE_FIELDS = ("billing_provider", "billing_mode", "billing_base_url")
ROLE_STYLES = {"user": "bold green", "assistant": "bold blue", "tool": "bold magenta"}

# ---------------------------------------------------------------------------- sessions


def session_doc(row: dict[str, Any]) -> dict[str, Any]:
    """Stable keys for a listed session."""
    return {
        "id": row.get("id"),
        "title": row.get("title"),
        "source": row.get("source"),
        "model": row.get("model"),
        "parent_session_id": row.get("parent_session_id"),
        "lineage_root_id": row.get("_lineage_root_id"),
        "started_at": row.get("started_at"),
        "ended_at": row.get("ended_at"),
        "end_reason": row.get("end_reason"),
        "last_active": row.get("last_active"),
        "message_count": row.get("message_count") or 0,
        "archived": bool(row.get("archived")),
        "preview": row.get("preview") or "",
    }


def compression_tips(db: Any, ids: list[str]) -> dict[str, str]:
    """``{tip: root}`` for the listed sessions that are the newest step of a compression chain.

    The collapsed list gets this from the library (it shows each chain once, as its tip);
    ``--all`` lists every step, so the tips are found here: a session that continues a
    compressed parent and that nothing continues in turn. One statement, depth-bounded
    like the library's own walks. The continuation test is the library's: the parent
    ended with 'compression' and the child started at or after that end.
    """
    if not ids:
        return {}
    return read(db, lambda c: LineageRepository(c).compression_tips(ids))


@click.command("sessions")
@click.option("--source", "sources", type=TEXT, multiple=True, metavar="SRC", help="Only these sources (repeatable).")
@click.option("--exclude-source", "exclude", type=TEXT, multiple=True, metavar="SRC",
              help="Leave out these sources (repeatable).")
@click.option("--limit", type=LIMIT, default=20, show_default=True, help="At most this many (1 to 1,000,000).")
@click.option("--offset", type=OFFSET, default=0, show_default=True, help="Skip this many first.")
@click.option("--all", "include_children", is_flag=True, help="Include child sessions (delegates, compression steps).")
@click.option("--archived", "archived", flag_value="with", help="Include archived sessions.")
@click.option("--only-archived", "archived", flag_value="only", help="Only archived sessions.")
@click.option("--by-activity", is_flag=True, help="Order by latest activity across a compression chain.")
@global_options
def sessions_cmd(sources: tuple[str, ...], exclude: tuple[str, ...], limit: int, offset: int,
                 include_children: bool, archived: str | None, by_activity: bool) -> None:
    """List sessions, newest first, with a preview.

    A compression chain is shown once, as its newest step; --all lists every
    session including delegates and compression steps. Archived sessions are left
    out, as Hermes lists them, unless --archived (or --only-archived) is given.
    """
    st = _state()
    src: Any = None if not sources else (sources[0] if len(sources) == 1 else list(sources))
    with session_db(st) as db:
        rows = db.list_sessions_rich(source=src, exclude_sources=list(exclude) or None, limit=limit, offset=offset,
                                     include_children=include_children, order_by_last_active=by_activity,
                                     include_archived=archived == "with", archived_only=archived == "only")
        if include_children:
            tips = compression_tips(db, [r["id"] for r in rows])
            for r in rows:
                if r["id"] in tips:
                    r["_lineage_root_id"] = tips[r["id"]]
    docs = [session_doc(r) for r in rows]
    if st.json:
        st.emit({"sessions": docs, "count": len(docs), "limit": limit, "offset": offset})
        return
    out = stdout_console()
    if not docs:
        out.print("No sessions." if offset == 0 else "No sessions at this offset.")
        return
    table: list[list[Any]] = []
    for d in docs:
        label = Text()
        if d["title"]:
            label.append(d["title"], style="bold")
            if d["preview"]:
                label.append(" — " + d["preview"], style="dim")
        else:
            label.append(d["preview"] or "(no user message)")
        sid = Text(d["id"])
        if d["lineage_root_id"]:
            sid.append(" ↺", style="cyan")
        if d["archived"]:
            sid.append(" ⌂", style="yellow")
        table.append([sid, (d["source"] or "")[:10], fmt_num(d["message_count"]), fmt_ago(d["last_active"]), label])
    out.print(fitted_table(out, ["Session", "Source", "Msgs", "Active", "Title / preview"], table, flex=4, right=[2]))
    more = f"; --offset {offset + limit} for more" if len(docs) == limit else ""
    legend = " ↺ = newest step of a compression chain." if any(d["lineage_root_id"] for d in docs) else ""
    legend += " ⌂ = archived." if any(d["archived"] for d in docs) else ""
    out.print(Text(f"{len(docs)} session(s) from offset {offset}{more}.{legend}", style="dim"))


@click.command()
@click.argument("session_id", metavar="ID", type=NONEMPTY)
@click.option("--full", is_flag=True, help="Show whole message contents (default: cut at 600 characters).")
@click.option("--no-messages", is_flag=True, help="Session details only.")
@global_options
def show(session_id: str, full: bool, no_messages: bool) -> None:
    """Show one session (ID or a unique prefix) and its messages."""
    st = _state()
    with session_db(st) as db:
        sid = resolve(db, session_id)
        row = db.get_session(sid) or {}
        messages = [] if no_messages else db.get_messages(sid)
        lineage = db.get_session_lineage(sid)
    if st.json:
        st.emit({"session": dict(row), "lineage": lineage, "messages": messages})
        return
    out = stdout_console()
    header = Table.grid(padding=(0, 2))
    header.add_column(style="bold", no_wrap=True)
    header.add_column(overflow="fold")
    ended = fmt_time(row.get("ended_at")) + (f" ({row['end_reason']})" if row.get("end_reason") else "")
    fields = [
        ("Session", row.get("id")),
        ("Title", row.get("title")),
        ("Source", row.get("source")),
        ("Model", row.get("model")),
        ("Parent", row.get("parent_session_id")),
        ("Started", fmt_time(row.get("started_at"))),
        ("Ended", ended if row.get("ended_at") else "— (open)"),
        ("Messages", f"{fmt_num(row.get('message_count'))} ({fmt_num(row.get('tool_call_count'))} tool calls)"),
        ("Tokens", f"in {fmt_num(row.get('input_tokens'))} · out {fmt_num(row.get('output_tokens'))} · "
                   f"cache r/w {fmt_num(row.get('cache_read_tokens'))}/{fmt_num(row.get('cache_write_tokens'))} · "
                   f"reasoning {fmt_num(row.get('reasoning_tokens'))}"),
        ("Cost", f"{fmt_cost(row.get('estimated_cost_usd'))} estimated"
                 + (f", {fmt_cost(row.get('actual_cost_usd'))} actual" if row.get("actual_cost_usd") else "")
                 + f" · {fmt_num(row.get('api_call_count'))} API calls"),
        ("Billing", " · ".join(str(row[k]) for k in ROUTE_FIELDS if row.get(k))),
    ]
    if len(lineage) > 1:
        fields.append(("Lineage", f"{len(lineage)} sessions, root {lineage[0]} (see '{PROG} lineage {sid}')"))
    for label, value in fields:
        if value not in (None, ""):
            header.add_row(label, Text(str(value)))
    out.print(header)
    limit = None if full else 600
    for m in messages:
        out.print()
        head = Text(f"#{m.get('id')} ", style="dim")
        role = m.get("role") or "?"
        head.append(role, style=ROLE_STYLES.get(role, "bold"))
        if m.get("tool_name"):
            head.append(f" {m['tool_name']}", style="magenta")
        head.append(f" · {fmt_time(m.get('timestamp'))}", style="dim")
        if m.get("finish_reason"):
            head.append(f" · {m['finish_reason']}", style="dim")
        out.print(head)
        body = content_text(m.get("content"))
        if limit is not None and len(body) > limit:
            body = body[:limit] + f"… [{len(body) - limit} more characters; --full]"
        if body.strip():
            out.print(Text(body))
        if m.get("reasoning"):
            out.print(Text(f"(reasoning: {len(m['reasoning'])} characters)", style="dim"))
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function", {}) if isinstance(tc, dict) else {}
            args = fn.get("arguments", "")
            if not isinstance(args, str):
                args = json.dumps(args, ensure_ascii=False)
            out.print(Text(f"→ {fn.get('name', '?')}({one_line(args, None if full else 200)})", style="yellow"))


@click.command()
@click.argument("session_id", metavar="ID", type=NONEMPTY)
@global_options
def lineage(session_id: str) -> None:
    """Show a session's chain (root → tip) and descendants."""
    st = _state()
    with session_db(st) as db:
        sid = resolve(db, session_id)
        chain = db.get_session_lineage(sid) or [sid]
        below = db.get_session_descendants(sid)
        below = [d for d in below if d not in set(chain)]
        info = sessions_by_id(db, [*chain, *below])
        named = {info[d]["parent_session_id"] for d in below if info.get(d, {}).get("parent_session_id")}
        parents = sessions_by_id(db, named - set(info))
    everything = {**parents, **info}

    def item(i: str) -> dict[str, Any]:
        r = info.get(i, {"id": i})
        return {"id": i, "title": r.get("title"), "source": r.get("source"),
                "parent_session_id": r.get("parent_session_id"), "started_at": r.get("started_at"),
                "ended_at": r.get("ended_at"), "end_reason": r.get("end_reason"),
                "message_count": r.get("message_count") or 0}

    chain_docs = [item(i) for i in chain]
    desc_docs = []
    for d in below:
        doc = item(d)
        doc["relation"] = relation(info.get(d, {}), everything.get(doc["parent_session_id"] or ""))
        desc_docs.append(doc)
    if st.json:
        st.emit({"session": sid, "root": chain[0], "tip": chain[-1], "chain": chain_docs, "descendants": desc_docs})
        return
    out = stdout_console()
    rows = []
    for n, link in enumerate(chain_docs):
        marker = "▶" if link["id"] == sid else str(n + 1)
        ended = link["end_reason"] or ("ended" if link["ended_at"] else "open")
        rows.append([marker, Text(link["id"], style="bold" if link["id"] == sid else ""), fmt_time(link["started_at"]),
                     ended[:16], fmt_num(link["message_count"]), link["title"] or ""])
    out.print(fitted_table(out, ["", "Session", "Started", "Ended as", "Msgs", "Title"], rows, flex=5, right=[4],
                           title="Chain, root → tip"))
    if desc_docs:
        out.print()
        rows = [[d["id"], d["relation"], fmt_time(d["started_at"]), fmt_num(d["message_count"]),
                 d["parent_session_id"] or "—"] for d in desc_docs]
        out.print(fitted_table(out, ["Session", "Relation", "Started", "Msgs", "Parent"], rows, flex=4, right=[3],
                               title="Descendants"))
    else:
        out.print(Text("No other descendants.", style="dim"))


# ---------------------------------------------------------------------------- search


@click.command()
@click.argument("query", type=NONEMPTY)
@click.option("--source", "sources", type=TEXT, multiple=True, metavar="SRC", help="Only these sources (repeatable).")
@click.option("--exclude-source", "exclude", type=TEXT, multiple=True, metavar="SRC",
              help="Leave out these sources (repeatable).")
@click.option("--role", "roles", type=TEXT, multiple=True, metavar="ROLE",
              help="Only these roles: user, assistant, tool... (repeatable).")
@click.option("--sort", type=click.Choice(SORT_CHOICES), default="rank", show_default=True)
@click.option("--limit", type=LIMIT, default=20, show_default=True, help="At most this many (1 to 1,000,000).")
@click.option("--offset", type=OFFSET, default=0, show_default=True, help="Skip this many first.")
@click.option("-C", "--context", "show_context", is_flag=True, help="Also show the messages before and after each hit.")
@global_options
def search(query: str, sources: tuple[str, ...], exclude: tuple[str, ...], roles: tuple[str, ...], sort: str,
           limit: int, offset: int, show_context: bool) -> None:
    """Full-text search over all messages.

    QUERY: words (all of them), "phrases", prefix*, a OR b, a NOT b or -b (without),
    NEAR(a b[, N]) (at most N words apart, default 10) and CJK text. Operators are upper
    case. A query that was not understood as written still runs, and one line says how
    it was read ("query_note" with --json).
    """
    st = _state()
    note = query_note(query)
    with session_db(st) as db:
        hits = db.search_messages(query, source_filter=list(sources) or None, exclude_sources=list(exclude) or None,
                                  role_filter=list(roles) or None, limit=limit, offset=offset,
                                  sort=None if sort == "rank" else sort)
    if st.json:
        st.emit({"query": query, "query_note": note, "sort": sort, "limit": limit, "offset": offset,
                 "count": len(hits), "results": hits})
        return
    out = stdout_console()
    if note is not None:
        out.print(Text(f"Note: {note}", style="yellow"))
    if not hits:
        out.print(Text(f"No messages match {query!r}."))
        return
    styled = out.color_system is not None and not out.no_color
    for n, h in enumerate(hits, start=offset + 1):
        head = Text(f"{n}. ", style="dim")
        head.append(h["session_id"], style="bold")
        head.append(f" · {h['role']}")
        if h.get("tool_name"):
            head.append(f" ({h['tool_name']})")
        head.append(f" · {fmt_time(h.get('timestamp'))} · {h.get('source') or '?'}", style="dim")
        out.print(head)
        snippet = highlight_snippet(re.sub(r"\s+", " ", h.get("snippet") or ""), styled)
        snippet.pad_left(3)
        out.print(snippet)
        if show_context:
            for c in h.get("context") or []:
                prefix = f"     {c.get('role')}: "
                body = one_line(c.get("content"), max(out.width - cell_len(prefix), 10)) or "(no text)"
                out.print(Text(prefix + body, style="dim"))
    more = f"; --offset {offset + limit} for more" if len(hits) == limit else ""
    out.print(Text(f"{len(hits)} result(s), sorted by {sort}{more}.", style="dim"))


# ---------------------------------------------------------------------------- stats


@click.command()
@click.option("--by", type=click.Choice(tuple(USAGE_KEYS)), default="model", show_default=True,
              help="Group usage by model, side task (title_generation, compression...) or billing route.")
@click.option("--source", type=TEXT, metavar="SRC", help="Only sessions from this source.")
@global_options
def stats(by: str, source: str | None) -> None:
    """Token and cost usage by model, task or route."""
    st = _state()
    with session_db(st) as db:
        rows = db.usage(by=by, source=source)
        counts = read(db, lambda c: SessionRepository(c).totals(source))
    metrics = ("sessions", "api_call_count", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
               "reasoning_tokens", "estimated_cost_usd", "actual_cost_usd")
    docs = []
    for r in rows:
        d: dict[str, Any] = dict(zip(USAGE_KEYS[by], r.key, strict=True))
        d.update({m: getattr(r, m) for m in metrics})
        docs.append(d)
    totals: dict[str, Any] = {"sessions": int(counts["sessions"]), "messages": int(counts["messages"])}
    for m in metrics[1:]:
        totals[m] = sum(d[m] for d in docs)
    totals["estimated_cost_usd"] = round(totals["estimated_cost_usd"], 10)
    totals["actual_cost_usd"] = round(totals["actual_cost_usd"], 10)
    if st.json:
        st.emit({"by": by, "source": source, "rows": docs, "totals": totals})
        return
    out = stdout_console()
    label = {"model": "Model", "task": "Task", "route": "Billing route"}[by]
    headers = [label, "Sess", "Calls", "Input", "Output", "Cache rd", "Est. cost"]
    counted = ("sessions", "api_call_count", "input_tokens", "output_tokens", "cache_read_tokens")

    def cells(fmt: Callable[[Any], str]) -> tuple[list[list[Any]], list[str]]:
        """Rows and footers with every count in one format."""
        rows = []
        for d in docs:
            if by == "model":
                name = d["model"]
            elif by == "task":
                name = d["task"] or "main loop"
            else:
                name = " · ".join(x for x in (d[k] for k in ROUTE_FIELDS) if x) or "(no route)"
            rows.append([name, *(fmt(d[m]) for m in counted), fmt_cost(d["estimated_cost_usd"])])
        return rows, ["Total", *(fmt(totals[m]) for m in counted), fmt_cost(totals["estimated_cost_usd"])]

    rows, footers = cells(fmt_num)
    if not table_fits(out, headers, rows, flex=0, footers=footers):
        rows, footers = cells(fmt_compact)  # exact counts would be cut; compact ones fit
    if not docs:
        out.print(Text("No token usage recorded yet."))
    else:
        out.print(fitted_table(out, headers, rows, flex=0, right=range(1, 7), footers=footers))
    extra = f"; actual cost {fmt_cost(totals['actual_cost_usd'])}" if totals["actual_cost_usd"] else ""
    where = f" from {source}" if source else ""
    out.print(Text(f"{fmt_num(totals['sessions'])} session(s), {fmt_num(totals['messages'])} message(s) in total"
                   f"{where}{extra}. Sess: sessions with usage on that row.", style="dim"))


COMMANDS = (sessions_cmd, show, lineage, search, stats)
