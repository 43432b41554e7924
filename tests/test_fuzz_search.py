"""Search results checked against a brute-force model of the same query over the same rows.

A seeded corpus (words with mixed case, punctuation-joined terms, accented words, tool
names and tool calls, CJK sentences) is searched with generated queries; the expected
answer is computed in Python from the rows read with plain SQL, never through our
search code. A sanitizer or routing regression that silently returned [] (or extra
rows) fails here. Both backends answer to the same model (PostgreSQL with fewer
examples: each costs a server round trip or three).
"""

from __future__ import annotations

import json
import random
import re
import unicodedata
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from hermes_store import SessionDB
from hermes_store.search import plan_search

from .helpers import module_store

pytestmark = pytest.mark.both_backends
#: Share of the SQLite example count a PostgreSQL run gets.
PG_SHARE = 0.3

WORDS = ["deploy", "Deploy", "DEPLOYMENT", "kubectl", "zebra", "quokka", "rollout", "config", "service",
         "pipeline", "alpha", "beta", "Café", "naïve", "ÉCOLE"]
JOINED = ["chat-send", "P2.2", "sp_new", "my-app.config.ts", "user@example.com", "v1.2.3"]
CJK = ["数据库迁移已经完成", "我们讨论数据库连接", "测试通信协议", "迁移计划完成了"]
#: Latin letters and digits inside CJK runs: one unicode61 token with the run, found by
#: word queries all the same (issue 21, point 7), and two that are other words.
MIXED = ["今天讨论A2A通信协议", "用GPT4模型测试2024年", "部署kubectl命令", "讨论a2ab不算", "xA2A通信", "Deploy完成",
         "会议：讨论zebra。"]
TOOLS = ["terminal", "web_search", "终端工具"]


def _text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 7)):
        roll = rng.random()
        if roll < 0.6:
            parts.append(rng.choice(WORDS))
        elif roll < 0.72:
            parts.append(rng.choice(JOINED))
        elif roll < 0.8:
            parts.append(rng.choice(MIXED))
        else:
            parts.append(rng.choice(CJK))
    return " ".join(parts) + rng.choice(["", ".", "!", "?"])


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionDB]:
    with module_store(request, tmp_path_factory, fill) as db:
        yield db


def fill(db: SessionDB) -> SessionDB:
    rng = random.Random(20240914)
    for sid, source in (("a", "cli"), ("b", "telegram"), ("c", "cli")):
        db.create_session(sid, source)
    for i in range(72):
        sid = "abc"[i % 3]
        kind = rng.random()
        if kind < 0.15:
            args = json.dumps({"cmd": _text(rng)})
            db.append_message(sid, "assistant", None, tool_calls=[
                {"id": f"t{i}", "type": "function", "function": {"name": rng.choice(TOOLS), "arguments": args}}])
        elif kind < 0.3:
            db.append_message(sid, "tool", _text(rng), tool_name=rng.choice(TOOLS), tool_call_id=f"t{i}")
        else:
            db.append_message(sid, rng.choice(["user", "assistant"]), _text(rng))
    # Timestamps out of id order, all distinct, so "newest" is a real ordering.
    db._execute_write(lambda c: c.execute("UPDATE messages SET timestamp = 1000 + ((id * 37) % 101)"))
    return db


@pytest.fixture(scope="module")
def rows(store: SessionDB) -> dict[int, tuple[float, list[str], list[str]]]:
    """id -> (timestamp, searchable columns, columns a term inside a CJK run is looked
    up in: content and tool name, but for tool results), read with plain SQL."""
    with store.engine.connect() as conn:
        out = {
            mid: (ts, [t for t in (content, tool_name, tool_calls) if isinstance(t, str)],
                  [] if role == "tool" else [t for t in (content, tool_name) if isinstance(t, str)])
            for mid, ts, role, content, tool_name, tool_calls in conn.execute(
                text("SELECT id, timestamp, role, content, tool_name, tool_calls FROM messages"))
        }
    assert len(out) == 72
    return out


def examples(store: SessionDB, n: int) -> settings:
    """``n`` examples on SQLite, a share of them on PostgreSQL."""
    share = 1.0 if store.engine.dialect.name == "sqlite" else PG_SHARE
    return settings(max_examples=max(1, int(n * share)), deadline=None)


def fold(text: str) -> str:
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).casefold()


def tokens(text: str) -> list[str]:
    """unicode61's view of a column: runs of letters and digits, case- and accent-folded."""
    return re.findall(r"[^\W_]+", fold(text))


def term_matches(columns: list[str], term: str) -> bool:
    """A plain word, or ``word*`` for a prefix, against any one column."""
    prefix = term.endswith("*")
    word = fold(term.rstrip("*"))
    return any(t.startswith(word) if prefix else t == word for c in columns for t in tokens(c))


def brute_force(columns: list[str], query: str, matches=term_matches, positive=None) -> bool:
    """FTS5's meaning of ``t (op t)*``, from its grammar (fts5parse.y).

    Terms separated only by spaces form one unit (an implicit AND binds tightest), then
    NOT, then AND, then OR: ``a b NOT c d`` is ``(a b) NOT (c d)``. ``positive``, when
    given, matches the terms that are not NOT-ed (``matches`` the NOT-ed ones).
    """
    def unit(text: str, match=matches) -> bool:
        return all(match(columns, t) for t in text.split())

    def factor(text: str) -> bool:
        first, *negated = text.split(" NOT ")
        return unit(first, positive or matches) and not any(unit(n) for n in negated)

    return any(all(factor(f) for f in group.split(" AND ")) for group in query.split(" OR "))


_CJK_CHAR = "[\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]"


def in_cjk_run(columns: list[str], term: str) -> bool:
    """A term of 3+ ASCII letters or digits written inside a CJK run: no ASCII letter or
    digit touches it, a CJK character does on one side at least (right before it, for a
    prefix ``term*``)."""
    body = term[:-1] if term.endswith("*") else term
    if not re.fullmatch(r"[A-Za-z0-9]{3,}", body):
        return False
    t = f"(?i:{re.escape(body)})"
    rule = f"(?<={_CJK_CHAR}){t}" if term.endswith("*") else (
        f"(?<={_CJK_CHAR}){t}(?![A-Za-z0-9])|(?<![A-Za-z0-9]){t}(?={_CJK_CHAR})")
    return any(re.search(rule, c) for c in columns)


def word_query_matches(row: tuple[float, list[str], list[str]], query: str) -> bool:
    """What a word query finds: FTS5's meaning, a positive term also inside a CJK run of
    the row's lookup columns (every term of these queries holds an ASCII letter, so
    every group is looked up; cron and sub-agent sessions are not in this corpus)."""
    _ts, columns, run_columns = row
    return brute_force(columns, query, positive=lambda cols, t: term_matches(cols, t) or in_cjk_run(run_columns, t))


def substring_matches(columns: list[str], term: str) -> bool:
    return any(term in c for c in columns)


words = st.sampled_from(["deploy", "Deploy", "deployment", "deplo*", "kubectl", "zebra", "quokka", "rollout",
                         "config", "service", "pipeline", "alpha", "beta", "chat", "send", "sp", "new", "p2",
                         "terminal", "search", "cmd", "function", "absent", "zeb*", "a*", "cafe", "CAFÉ",
                         "naive", "ecole", "école", "example", "com", "user", "v1", "ts", "caf*", "a2a", "A2A",
                         "A2A*", "gpt4", "GPT4*", "2024", "a2ab"])
operator = st.sampled_from([" ", " ", " AND ", " OR ", " NOT "])


@st.composite
def word_queries(draw: st.DrawFn) -> str:
    terms = draw(st.lists(words, min_size=1, max_size=4))
    out = terms[0]
    for term in terms[1:]:
        out += draw(operator) + term
    return out


def test_brute_force_model_agrees_with_known_cases() -> None:
    """The model itself, on hand-checked cases (so a wrong model cannot hide a bug)."""
    cols = ["Deploy the zebra", '{"cmd": "kubectl"}']
    assert brute_force(cols, "deploy") and brute_force(cols, "zeb*") and brute_force(cols, "kubectl")
    assert not brute_force(cols, "deployment") and not brute_force(cols, "deploy NOT zebra")
    assert brute_force(cols, "absent OR zebra") and not brute_force(cols, "absent zebra")
    assert brute_force(cols, "zebra NOT absent AND deploy") and not brute_force(cols, "zebra AND absent OR beta")
    # Checked against SQLite: the implicit AND groups before NOT applies.
    assert brute_force(["deploy"], "deploy deploy NOT deploy deployment")
    assert not brute_force(["deploy deployment"], "deploy deploy NOT deploy deployment")
    assert not brute_force(["deploy"], "deploy NOT deploy")
    # A term inside a CJK run is found by a positive term only; a longer word is not it.
    run = (0.0, ["今天讨论A2A通信 and kubectl"], ["今天讨论A2A通信 and kubectl"])
    assert word_query_matches(run, "a2a") and word_query_matches(run, "A2A* kubectl")
    assert not brute_force(run[1], "a2a") and not word_query_matches(run, "a2a NOT kubectl")
    assert word_query_matches(run, "kubectl NOT a2a")  # NOT keeps its word meaning: A2A is no word here
    assert not word_query_matches((0.0, ["讨论a2ab", "xA2A通信"], ["讨论a2ab", "xA2A通信"]), "a2a")
    assert word_query_matches((0.0, ["讨论a2ab"], ["讨论a2ab"]), "a2a*")
    assert not word_query_matches((0.0, ["今天讨论A2A通信"], []), "a2a")  # a tool result
    # unicode61 splits compounds and folds one diacritic.
    assert brute_force(["mail user@example.com"], "example") and brute_force(["v1.2.3"], "v1")
    assert brute_force(["un Café"], "cafe") and brute_force(["un Café"], "CAFÉ") and brute_force(["ÉCOLE"], "ecole")


def test_word_queries_equal_brute_force(store: SessionDB, rows: dict) -> None:
    @examples(store, 250)
    @given(word_queries(), st.sampled_from(["newest", "oldest"]), st.integers(0, 30), st.integers(0, 10))
    def run(query: str, sort: str, limit: int, offset: int) -> None:
        assert plan_search(query).kind == "word" and plan_search(query).match == query  # passes through as is
        expected = sorted((mid for mid, row in rows.items() if word_query_matches(row, query)),
                          key=lambda mid: (rows[mid][0], mid), reverse=sort == "newest")
        got = [h["id"] for h in store.search_messages(query, sort=sort, limit=limit, offset=offset)]
        assert got == expected[offset:offset + limit]

    run()


def test_ranked_word_queries_return_the_same_set(store: SessionDB, rows: dict) -> None:
    @examples(store, 120)
    @given(word_queries())
    def run(query: str) -> None:
        expected = {mid for mid, row in rows.items() if word_query_matches(row, query)}
        got = [h["id"] for h in store.search_messages(query, limit=1000)]
        assert len(got) == len(set(got)) and set(got) == expected

    run()


cjk_terms = st.sampled_from(["数据库迁移", "数据库连接", "迁移计划", "通信协议", "已经完成", "讨论数据",
                             "计划完成了", "完成", "数据", "迁移", "终端", "终端工具", "不存在的词"])


def test_cjk_queries_equal_brute_force_substring_scan(store: SessionDB, rows: dict) -> None:
    """Trigram (>= 3-character terms, with FTS5's operators) and short-term substring routes.

    The trigram index leaves tool rows out; they are found by LIKE with the same
    meaning. The substring route ORs its positive terms (its documented meaning), each
    without the exclusions of its OR branch. ``-term`` is ``NOT term``; NEAR is read as
    its two terms (CJK text has no word positions). PostgreSQL answers both routes by
    substring.
    """
    @examples(store, 200)
    @given(st.lists(cjk_terms, min_size=1, max_size=3),
           st.lists(st.sampled_from([" ", " OR ", " NOT ", " AND ", " -", "near"]), min_size=2, max_size=2))
    def run(terms: list[str], joiners: list[str]) -> None:
        query = terms[0]
        branches = [[terms[0], ""]]  # per OR branch: its FTS5 text, its exclusions (-term) as NOT units
        for j, t in zip(joiners, terms[1:], strict=False):  # one joiner per term after the first; spare ones unused
            query += f" NEAR({t} {terms[0]})" if j == "near" else j + t
            if j == " OR ":
                branches.append([t, ""])
            elif j == " -":
                branches[-1][1] += " NOT " + t
            else:
                branches[-1][0] += f" {t} {terms[0]}" if j == "near" else j + t
        model = " OR ".join(text + excluded for text, excluded in branches)
        plan = plan_search(query)
        assert plan.kind in ("trigram", "substring")
        if plan.kind == "substring":
            def branch(cols: list[str], group: str) -> bool:
                factors = [f.split(" NOT ") for f in group.split(" AND ")]
                positives = [p for first, *_neg in factors for p in first.split()]
                units = [unit.split() for _first, *negated in factors for unit in negated]
                return any(substring_matches(cols, p) for p in positives) and not any(
                    all(substring_matches(cols, n) for n in unit) for unit in units)

            expected = {mid for mid, (_ts, cols, _r) in rows.items() if any(branch(cols, g) for g in model.split(" OR "))}
        else:
            expected = {mid for mid, (_ts, cols, _r) in rows.items() if brute_force(cols, model, substring_matches)}
        got = [h["id"] for h in store.search_messages(query, limit=1000)]
        assert len(got) == len(set(got)) and set(got) == expected, (query, plan.kind)

    run()


# ------------------------------------------------------------------ the operators (issue 30, row 14)

_NEAR = re.compile(r"NEAR\((\S+)\s+(\S+?)(?:,\s*(\d+))?\)")


def near_matches(columns: list[str], a: str, b: str, distance: int) -> bool:
    """FTS5's NEAR(a b, N): in one column, an ``a`` and a ``b`` (either order, the same
    token allowed) with at most N tokens between them."""
    def at(toks: list[str], term: str) -> list[int]:
        word = fold(term.rstrip("*"))
        return [i for i, t in enumerate(toks) if (t.startswith(word) if term.endswith("*") else t == word)]

    for column in columns:
        toks = tokens(column)
        if any(abs(i - j) - 1 <= distance for i in at(toks, a) for j in at(toks, b)):
            return True
    return False


def operator_matches(row: tuple[float, list[str], list[str]], query: str) -> bool:
    """The grammar of :mod:`hermes_store.search.query`, from its rules, not its code.

    An OR branch: an optional leading ``NOT x`` and ``-x`` terms at its ends are
    exclusions; the rest is FTS5's ``t (op t)*`` (:func:`brute_force`), where a term may
    be ``NEAR(a b[, N])`` (N = 10 by default). A branch with nothing but exclusions
    matches nothing (and is dropped). A positive term is also found inside a CJK run,
    unless the query (as read) holds NEAR: then the word index alone answers.
    """
    _ts, columns, run_columns = row
    nears: dict[str, tuple[str, str, int]] = {}

    def hide(m: re.Match) -> str:
        key = f"near{len(nears)}"
        nears[key] = (m.group(1), m.group(2), int(m.group(3) or 10))
        return key

    text = _NEAR.sub(hide, query)

    def word(cols: list[str], item: str) -> bool:
        if item in nears:
            a, b, n = nears[item]
            return near_matches(cols, a, b, n)
        return term_matches(cols, item)

    branches = []
    for branch in text.split(" OR "):
        toks = branch.split()
        excluded = []
        if len(toks) >= 2 and toks[0] == "NOT":
            excluded.append(toks[1])
            toks = toks[2:]
        while toks and toks[0].startswith("-"):
            excluded.append(toks.pop(0)[1:])
        while toks and toks[-1].startswith("-"):
            excluded.append(toks.pop()[1:])
        if toks:  # a branch of exclusions only is dropped, its NEAR groups with it
            branches.append((toks, excluded))
    has_near = any(t in nears for toks, excluded in branches for t in (*toks, *excluded))

    def positive(cols: list[str], item: str) -> bool:
        return word(cols, item) or (not has_near and in_cjk_run(run_columns, item))

    return any(brute_force(columns, " ".join(toks), word, positive) and not any(word(columns, e) for e in excluded)
               for toks, excluded in branches)


single = st.sampled_from(["deploy", "deployment", "deplo*", "kubectl", "zebra", "quokka", "rollout", "config",
                          "service", "pipeline", "alpha", "beta", "chat", "send", "terminal", "cmd", "cafe",
                          "example", "zeb*", "a2a", "gpt4"])


@st.composite
def operands(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 3)) == 0:
        a, b = draw(single), draw(single)
        distance = draw(st.sampled_from(["", ", 0", ", 1", ", 2", ", 5", ",3"]))
        return f"NEAR({a} {b}{distance})"
    return draw(words)


@st.composite
def operator_queries(draw: st.DrawFn) -> str:
    branches = []
    for _ in range(draw(st.integers(1, 3))):
        parts = []
        if draw(st.booleans()):
            parts.append("NOT " + draw(operands()))
        parts += ["-" + draw(words) for _ in range(draw(st.integers(0, 1)))]
        terms = draw(st.lists(operands(), min_size=0, max_size=3))
        if terms:
            body = terms[0]
            for term in terms[1:]:
                body += draw(st.sampled_from([" ", " ", " AND ", " NOT "])) + term
            parts.append(body)
        parts += ["-" + draw(words) for _ in range(draw(st.integers(0, 2)))]
        branches.append(" ".join(parts))
    return " OR ".join(b for b in branches if b) or "-absent"


def test_operator_model_agrees_with_known_cases() -> None:
    row = (0.0, ["kubernetes deploy went fine", "terminal"], ["kubernetes deploy went fine", "terminal"])
    assert operator_matches(row, "NEAR(kubernetes deploy)") and operator_matches(row, "NEAR(deploy kubernetes, 0)")
    assert not operator_matches(row, "NEAR(kubernetes fine, 1)") and operator_matches(row, "NEAR(kubernetes fine, 2)")
    assert not operator_matches(row, "NEAR(fine terminal, 50)")  # two columns
    assert not operator_matches(row, "kubernetes -deploy") and operator_matches(row, "kubernetes -zebra")
    assert not operator_matches(row, "NOT zebra") and operator_matches(row, "NOT zebra deploy")
    assert not operator_matches(row, "NOT deploy kubernetes") and operator_matches(row, "zebra OR fine -zebra")
    assert not operator_matches(row, "-zebra OR -quokka") and operator_matches(row, "kub* NOT NEAR(deploy zebra)")


def test_operator_queries_equal_the_model(store: SessionDB, rows: dict) -> None:
    """Exclusions (``-term``, a leading NOT), NEAR and the FTS5 operators mixed, on both
    backends, against :func:`operator_matches`."""
    @examples(store, 250)
    @given(operator_queries(), st.sampled_from(["newest", "oldest"]), st.integers(0, 30), st.integers(0, 10))
    def run(query: str, sort: str, limit: int, offset: int) -> None:
        assert plan_search(query).kind in ("word", "empty")
        expected = sorted((mid for mid, row in rows.items() if operator_matches(row, query)),
                          key=lambda mid: (rows[mid][0], mid), reverse=sort == "newest")
        got = [h["id"] for h in store.search_messages(query, sort=sort, limit=limit, offset=offset)]
        assert got == expected[offset:offset + limit], query

    run()


def test_ranked_operator_queries_return_the_same_set(store: SessionDB, rows: dict) -> None:
    @examples(store, 100)
    @given(operator_queries())
    def run(query: str) -> None:
        expected = {mid for mid, row in rows.items() if operator_matches(row, query)}
        got = [h["id"] for h in store.search_messages(query, limit=1000)]
        assert len(got) == len(set(got)) and set(got) == expected, query

    run()


def test_corpus_is_varied_enough(rows: dict) -> None:
    """Guard against a corpus where every query trivially returns all or nothing."""
    hit_counts = [sum(brute_force(cols, q) for _ts, cols, _r in rows.values())
                  for q in ("deploy", "zebra", "kubectl", "terminal", "deplo*", "chat", "cafe", "example", "ecole")]
    assert all(0 < n < len(rows) for n in hit_counts), hit_counts
    assert sum(any("数据库迁移" in c for c in cols) for _ts, cols, _r in rows.values()) > 2
    # terms inside CJK runs: rows only the lookup finds, and rows where it must not look
    only_runs = [q for q in ("a2a", "gpt4", "2024", "kubectl", "zebra", "deploy")
                 if any(word_query_matches(r, q) and not brute_force(r[1], q) for r in rows.values())]
    assert len(only_runs) >= 4, only_runs
    assert any(in_cjk_run(cols, "a2a") and not r for _ts, cols, r in rows.values())  # in a tool result

