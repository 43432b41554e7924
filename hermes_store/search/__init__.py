"""Search helpers: FTS5 query sanitizing, the operator grammar and index routing (pure, no database access)."""

from .query import SearchPlan, contains_cjk, escape_like, plan_search, query_note, sanitize_fts5_query

__all__ = ["SearchPlan", "contains_cjk", "escape_like", "plan_search", "query_note", "sanitize_fts5_query"]
