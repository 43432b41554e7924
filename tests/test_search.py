"""Search through SessionDB: routing, snippets, context, filters, and fuzzing.

Every test that goes through the public API runs on both backends (``db`` is a SQLite
file or a PostgreSQL database); the ones that reach into SQLite itself (journal modes,
FTS5 shadow tables, FTS5's own parser) say so and have a PostgreSQL twin where the
behaviour matters there too.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
import unicodedata
from pathlib import Path
from collections.abc import Iterator

import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, OperationalError

from hermes_store import SessionDB
from hermes_store.engine import create_engine
from hermes_store.errors import DatabaseLockedError, HermesStoreError
from hermes_store.repositories.search import SearchRepository, boolean_groups, is_query_syntax_error
from hermes_store.search import plan_search

from .factories import set_times
from .helpers import module_store

pytestmark = pytest.mark.both_backends
#: Hypothesis examples per test and backend: a PostgreSQL round trip costs more.
EXAMPLES = {"sqlite": 1.0, "postgresql": 0.3}


def fuzz_settings(backend: str, examples: int) -> settings:
    return settings(max_examples=max(1, int(examples * EXAMPLES[backend])), deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def corpus(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionDB]:
    """The corpus, built once per backend for the tests that only read it."""
    with module_store(request, tmp_path_factory, build_corpus) as store:
        yield store


@pytest.fixture
def fresh_corpus(db: SessionDB) -> SessionDB:
    """The corpus in this test's own database (for tests that lock, damage or close it)."""
    return build_corpus(db)


def build_corpus(db: SessionDB) -> SessionDB:
    db.create_session("cli1", "cli", model="m-cli")
    db.create_session("tg1", "telegram", model="m-tg")
    set_times(db, "cli1", started_at=1000.0)
    set_times(db, "tg1", started_at=2000.0)
    rows = [
        ("cli1", "user", "How do I deploy the chat-send service?", {}),
        ("cli1", "assistant", None, {"tool_calls": [{"id": "t1", "function": {"name": "terminal", "arguments": "{\"cmd\": \"kubectl apply my-app.config.ts\"}"}}]}),
        ("cli1", "tool", "deployment rolled out: 数据库连接成功 on P2.2", {"tool_name": "terminal", "tool_call_id": "t1"}),
        ("cli1", "assistant", "Deployed. 数据库迁移已经完成 and sp_new is live", {}),
        ("tg1", "user", "我们需要讨论数据库迁移计划", {}),
        ("tg1", "assistant", "Agent通信 works; 100%完成 soon. Deploy later.", {}),
        ("tg1", "user", "what about 数据", {}),
    ]
    for sid, role, content, extra in rows:
        db.append_message(sid, role, content, **extra)
    db._execute_write(lambda c: c.execute("UPDATE messages SET timestamp = 5000 + id"))
    return db


def ids(hits):
    return [h["id"] for h in hits]


def test_word_search_ranks_and_snippets(corpus: SessionDB) -> None:
    hits = corpus.search_messages("deploy")
    assert set(ids(hits)) == {1, 6}  # "Deployed" is another word: no stemming
    hit = next(h for h in hits if h["id"] == 1)
    assert ">>>deploy<<<" in hit["snippet"]
    assert hit["source"] == "cli" and hit["model"] == "m-cli" and hit["session_started"] == 1000.0
    assert set(hit) == {"id", "session_id", "role", "snippet", "timestamp", "tool_name", "source", "model",
                        "session_started", "context"}


def test_context_is_previous_hit_next_same_session(corpus: SessionDB) -> None:
    hit = next(h for h in corpus.search_messages("sp_new"))
    assert hit["id"] == 4
    assert [c["role"] for c in hit["context"]] == ["tool", "assistant"]  # no next in this session
    assert hit["context"][1]["content"].startswith("Deployed.")
    first = corpus.search_messages("chat-send")[0]
    assert [c["content"][:6] for c in first["context"] if c["content"]] == ["How do"]
    assert len(first["context"]) == 2  # hit + next (assistant with no content)


def test_tool_names_and_arguments_are_searchable(corpus: SessionDB) -> None:
    assert 2 in ids(corpus.search_messages("kubectl"))
    assert 2 in ids(corpus.search_messages("my-app.config.ts"))
    terminal = ids(corpus.search_messages("terminal"))
    assert {2, 3} <= set(terminal)


def test_dotted_and_dashed_terms(corpus: SessionDB) -> None:
    assert ids(corpus.search_messages("P2.2")) == [3]
    assert ids(corpus.search_messages("chat-send")) == [1]


def test_cjk_trigram_route(corpus: SessionDB) -> None:
    hits = corpus.search_messages("数据库迁移")
    assert set(ids(hits)) == {4, 5}
    assert any(">>>数据库迁移<<<" in h["snippet"] for h in hits)


def test_cjk_trigram_route_still_finds_tool_rows(corpus: SessionDB) -> None:
    assert ids(corpus.search_messages("数据库连接")) == [3]


def test_short_cjk_falls_back_to_substring(corpus: SessionDB) -> None:
    hits = corpus.search_messages("数据")
    assert ids(hits) == [7, 5, 4, 3]  # newest first
    assert ">>>数据<<<" in hits[0]["snippet"]
    assert ids(corpus.search_messages("Agent通信")) == [6]
    assert ids(corpus.search_messages("agent")) == [6]  # a word inside a CJK run (search.latin_in_cjk)
    assert ids(corpus.search_messages("100%完成")) == [6]
    assert corpus.search_messages("100_完成") == []  # '_' literal


def test_filters_sort_and_paging(corpus: SessionDB) -> None:
    assert set(ids(corpus.search_messages("deploy", source_filter=["telegram"]))) == {6}
    assert set(ids(corpus.search_messages("deplo*", exclude_sources=["telegram"]))) == {1, 3, 4}
    assert set(ids(corpus.search_messages("deplo*", role_filter=["user", "tool"]))) == {1, 3}
    assert ids(corpus.search_messages("deplo*", sort="newest")) == [6, 4, 3, 1]
    assert ids(corpus.search_messages("deplo*", sort="oldest")) == [1, 3, 4, 6]
    assert ids(corpus.search_messages("deplo*", sort="oldest", limit=1, offset=1)) == [3]
    assert ids(corpus.search_messages("数据", sort="oldest", limit=2)) == [3, 4]


def test_operators_keep_meaning(corpus: SessionDB) -> None:
    assert ids(corpus.search_messages("deplo* NOT service", sort="oldest")) == [3, 4, 6]
    assert set(ids(corpus.search_messages("kubectl OR later"))) == {2, 6}
    assert ids(corpus.search_messages('"chat-send service"')) == [1]
    assert set(ids(corpus.search_messages("deplo*"))) == {1, 3, 4, 6}


@pytest.mark.parametrize("query", ["", "   ", "***", "AND", '""', "()", "\x00"])
def test_blank_queries_return_empty(corpus: SessionDB, query: str) -> None:
    assert corpus.search_messages(query) == []


def fold(text: str) -> str:
    """Case- and accent-insensitive form, at least as coarse as FTS5's unicode61 folding."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).casefold()


def ascii_lower(text: str) -> str:
    """SQLite LIKE's case folding: ASCII letters only."""
    return text.translate(str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz"))


def message_texts(store: SessionDB) -> dict[int, list[str]]:
    """Each message's searchable columns, read with plain SQL (not through search)."""
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT id, content, tool_name, tool_calls FROM messages")).fetchall()
    return {mid: [t for t in texts if isinstance(t, str)] for mid, *texts in rows}


def check_hits_against_corpus(texts: dict[int, list[str]], query: str, hits: list[dict], limit: int) -> None:
    """An independent check of a search result: every hit really contains the query.

    Word route: each hit holds at least one word of one query term (folded as FTS5
    folds). Trigram route: at least one term as a substring. Substring route: the ids
    are exactly a brute-force LIKE-style scan (ASCII case folding, OR of the positive
    terms, each without the exclusions of its OR branch).
    """
    plan = plan_search(query)
    got = [h["id"] for h in hits]
    assert len(got) == len(set(got)) and len(got) <= limit
    if plan.kind == "empty":
        assert got == []
        return
    for hit in hits:
        assert isinstance(hit["snippet"], str)
        assert hit["id"] in texts
        columns = texts[hit["id"]]
        if plan.kind == "word":
            words = [w for t in plan.terms for w in re.findall(r"[^\W_]+", fold(t))]
            assert any(w in fold(c) for w in words for c in columns), (query, hit["id"], columns)
        else:
            assert any(fold(t) in fold(c) for t in plan.terms for c in columns), (query, hit["id"], columns)
    if plan.kind == "substring":
        def has(term: str, columns: list[str]) -> bool:
            return any(ascii_lower(term) in ascii_lower(c) for c in columns)

        # any one positive term, without the exclusions of its OR branch (NOT x, -x)
        expected = {mid for mid, columns in texts.items()
                    if any(has(p, columns) and not any(all(has(n, columns) for n in unit) for unit in negatives)
                           for positives, negatives in boolean_groups(plan.match) for p in positives)}
        if len(expected) <= limit:
            assert set(got) == expected, query
        else:
            assert len(got) == limit and set(got) <= expected


ANY_QUERY = st.text(alphabet=st.sampled_from(list('abc 数据库迁移"*:^+-(){}._%\\\'ANDORTNEAR\x00🙂한글かな\ud800é@'))
                    | st.characters(), max_size=40)
CORPUS_QUERY = st.lists(st.sampled_from(["deploy", "Deploy", "数据", "数据库迁移", "terminal", "kubectl", "service",
                                         "P2.2", "chat-send", "完成", "later", "sp_new", "nothing", "OR", "NOT", "AND",
                                         "deplo*", "\"chat-send service\"", "(", ")", ":", "*", "config", "ts",
                                         "new", "app"]),
                        min_size=1, max_size=5).map(" ".join)


def test_search_never_raises_and_hits_really_match(corpus: SessionDB) -> None:
    texts = message_texts(corpus)

    @fuzz_settings(corpus.engine.dialect.name, 300)
    @given(ANY_QUERY)
    def run(query: str) -> None:
        result = corpus.search_messages(query, sort="newest", limit=50)
        check_hits_against_corpus(texts, query, result, 50)
        assert ids(result) == sorted(ids(result), reverse=True)  # the corpus' timestamps grow with the id

    run()


def test_corpus_words_in_any_combination_hit_only_matching_rows(corpus: SessionDB) -> None:
    """Queries made of words the corpus holds (so hits are common): each must really match."""
    texts = message_texts(corpus)

    @fuzz_settings(corpus.engine.dialect.name, 150)
    @given(CORPUS_QUERY)
    def run(query: str) -> None:
        check_hits_against_corpus(texts, query, corpus.search_messages(query, limit=50), 50)

    run()


def test_words_inside_compounds_and_accented_words(db: SessionDB) -> None:
    """Words are cut and folded as FTS5's unicode61 does, on both backends: a word
    inside an address, host, file name or version is a word; one diacritic folds."""
    db.create_session("s", "cli")
    mail = db.append_message("s", "user", "write to user@example.com about v1.2.3")
    host = db.append_message("s", "assistant", "deployed foo.example.com/main.py")
    cafe = db.append_message("s", "user", "un Café crème, naïve résumé")
    viet = db.append_message("s", "user", "tiếng Việt")
    db._execute_write(lambda c: c.execute("UPDATE messages SET timestamp = 100 + id"))

    def found(query: str) -> list[int]:
        return ids(db.search_messages(query, sort="oldest"))

    assert found("example") == [mail, host]
    assert found("com OR py") == [mail, host]
    assert found('"example com"') == [mail, host] and found('"com about"') == [mail]
    assert found("main") == [host] and found("2.3") == [mail] and found("v1") == [mail]
    assert found("1.2") == []  # "1" is no word of "v1.2.3", on either backend
    assert found("cafe") == found("CAFÉ") == found("café") == [cafe]
    assert found("naive resume") == [cafe] and found("creme*") == [cafe]
    assert found("viet") == [] and found("việt") == found("VIỆT") == [viet]  # two diacritics: kept, as in FTS5
    hit = db.search_messages("cafe")[0]
    assert ">>>Café<<<" in hit["snippet"]


def test_snippet_comes_from_the_matching_column(corpus: SessionDB) -> None:
    hit = next(h for h in corpus.search_messages("kubectl") if h["id"] == 2)
    assert ">>>kubectl<<<" in hit["snippet"]  # content is NULL: the tool_calls column matched
    tool = next(h for h in corpus.search_messages("terminal", role_filter=["tool"]))
    assert tool["tool_name"] == "terminal" and ">>>terminal<<<" in tool["snippet"]


def test_trigram_hits_and_tool_rows_merge_in_order_and_pages(db: SessionDB, backend: str) -> None:
    db.create_session("s", "cli")
    ids = []
    for i in range(8):
        role = "tool" if i % 2 else "user"
        ids.append(db.append_message("s", role, f"第{i}条 数据库迁移 记录", tool_name="t" if role == "tool" else None))
    db._execute_write(lambda c: c.execute("UPDATE messages SET timestamp = 100 + id"))
    newest = [h["id"] for h in db.search_messages("数据库迁移", sort="newest", limit=100)]
    assert newest == sorted(ids, reverse=True)  # tool rows (via substring) interleave by time
    pages = [h["id"] for o in range(0, 8, 3) for h in db.search_messages("数据库迁移", sort="oldest", limit=3, offset=o)]
    assert pages == sorted(ids)
    ranked = [h["id"] for h in db.search_messages("数据库迁移", limit=100)]
    if backend == "sqlite":
        assert set(ranked) == set(ids) and set(ranked[:4]) == set(ids[0::2])  # ranked index hits first
    else:
        assert ranked == newest  # PostgreSQL answers CJK by substring: no rank, newest first
    assert [h["id"] for h in db.search_messages("数据库迁移", limit=2, offset=3)] == ranked[3:5]


# ---------------------------------------------------------------- each sanitizer rule, exact ids


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ('"chat-send service"', [1]),  # balanced phrase kept
        ('"chat-send serv"*', [1]),  # phrase prefix
        ('"chat-send', [1]),  # unbalanced quote dropped
        ("chat-send", [1]),  # dash-joined term quoted as a phrase
        ("P2.2", [3]),  # dotted term
        ("my-app.config.ts", [2]),  # dots and dashes, in tool-call arguments
        ("sp_new", [4]),  # underscore-joined term
        ("deplo*", [1, 3, 4, 6]),  # prefix
        ("deplo***", [1, 3, 4, 6]),  # runs of * collapse
        ("*kubectl", [2]),  # leading * dropped
        ("kubectl OR later", [2, 6]),  # OR
        ("deplo* NOT service", [3, 4, 6]),  # NOT
        ("deplo* AND NOT service", [3, 4, 6]),  # a run of operators keeps the last
        ("deploy AND", [1, 6]),  # dangling AND at the end
        ("OR deploy", [1, 6]),  # dangling OR at the start
        ("NOT kubectl", []),  # a leading NOT excludes: nothing left to look for (issue 30, row 14)
        ("deploy -kubectl", [1, 6]),  # -term excludes
        ("deploy service", [1]),  # implicit AND
        ("(deploy) {service}", [1]),  # grouping and column-set syntax become spaces
        ("^deploy+service", [1]),  # ^ and + become spaces
        ("content:kubectl", []),  # ':' is no column filter: "content" is just a word here
        ("terminal: kubectl", [2]),
        ("deploy!", [1, 6]),  # trailing punctuation trimmed
        ("Deploy", [1, 6]),  # case-insensitive
        ("deploy and", []),  # lowercase "and" is an ordinary word that no row holds
        ("数据库迁移", [4, 5]),  # trigram route
        ("「数据库迁移」", [4, 5]),  # CJK brackets trimmed
        ("数据库迁移 OR 数据库连接", [3, 4, 5]),  # trigram OR, tool row via substring
        ("数据", [3, 4, 5, 7]),  # short CJK: substring route
        ("100%完成", [6]),  # % literal
    ],
)
def test_each_sanitizer_rule_finds_the_known_rows(corpus: SessionDB, query: str, expected: list[int]) -> None:
    """A sanitizer regression that produced bad SQL would turn these into []."""
    assert ids(corpus.search_messages(query, sort="oldest", limit=100)) == expected


def test_tool_rows_follow_the_query_operators(db: SessionDB) -> None:
    """Trigram queries find tool rows by LIKE, which must mean what FTS5 means."""
    db.create_session("s", "cli")
    plan_only = db.append_message("s", "user", "数据库迁移 计划")
    tool_other = db.append_message("s", "tool", "测试数据 only", tool_name="t")
    tool_both = db.append_message("s", "tool", "数据库迁移 and 测试数据", tool_name="t")
    user_both = db.append_message("s", "user", "数据库迁移 and 测试数据")
    tool_null = db.append_message("s", "tool", "数据库迁移 alone", tool_name=None)
    db._execute_write(lambda c: c.execute("UPDATE messages SET timestamp = 100 + id"))

    def found(query: str) -> list[int]:
        return ids(db.search_messages(query, sort="oldest", limit=100))

    assert found("数据库迁移 NOT 测试数据") == [plan_only, tool_null]
    assert found("数据库迁移 测试数据") == [tool_both, user_both]
    assert found("数据库迁移 OR 测试数据") == [plan_only, tool_other, tool_both, user_both, tool_null]
    assert found("测试数据 NOT 数据库迁移 OR 数据库迁移 NOT 测试数据") == [plan_only, tool_other, tool_null]
    assert found("数据库迁移 AND alone") == [tool_null]
    # A term under three characters has no trigram: FTS5 leaves it out, so must LIKE.
    assert found("数据库迁移 ab") == found("数据库迁移") and found("数据库迁移 NOT ab") == found("数据库迁移")
    assert found("ab OR 测试数据") == found("测试数据") and found("ab NOT 数据库迁移") == []


@pytest.mark.parametrize(
    ("match", "groups"),
    [
        ("a", [(["a"], [])]),
        ("a b", [(["a", "b"], [])]),
        ("a OR b", [(["a"], []), (["b"], [])]),
        ("a NOT b", [(["a"], [["b"]])]),
        ("a b NOT c d OR e", [(["a", "b"], [["c", "d"]]), (["e"], [])]),
        ("a NOT b AND c NOT d", [(["a", "c"], [["b"], ["d"]])]),
        ('"x y"* "AND" z*', [(["x y", "AND", "z"], [])]),
    ],
)
def test_boolean_groups_read_fts5_precedence(match: str, groups: list) -> None:
    assert boolean_groups(match) == groups


# ---------------------------------------------------------------- failures are not "no results"

ROUTES = [
    ("deploy", {}),  # word index, FTS5 ranks and cuts
    ("deploy", {"source_filter": ["cli"]}),  # word index joined with filters
    ("数据库迁移", {}),  # trigram index + tool rows
    ("数据", {}),  # substring scan
]


def _rollback_journal_copy(corpus: SessionDB, tmp_path: Path) -> Path:
    """The corpus as a rollback-journal file (Hermes' fallback where WAL is unavailable).

    Under WAL a reader never waits for a writer, so only this mode can show a read
    that meets a lock.
    """
    path = tmp_path / "journal" / "state.db"
    path.parent.mkdir()
    corpus.close()
    shutil.copy(corpus.db_path, path)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode = DELETE").fetchone()[0] == "delete"
    conn.close()
    return path


@pytest.mark.sqlite_only
@pytest.mark.parametrize(("query", "filters"), ROUTES)
def test_locked_database_raises_instead_of_returning_nothing(
    fresh_corpus: SessionDB, tmp_path: Path, query: str, filters: dict
) -> None:
    path = _rollback_journal_copy(fresh_corpus, tmp_path)
    engine = create_engine(path, busy_timeout_ms=0)
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        with engine.connect() as conn:
            repo = SearchRepository(conn)
            found = ids(repo.search_messages(query, **filters))
            assert found  # the query itself is fine
            conn.rollback()
            blocker.execute("BEGIN EXCLUSIVE")
            with pytest.raises((OperationalError, DatabaseLockedError), match="locked"):
                repo.search_messages(query, **filters)
            conn.rollback()
            blocker.execute("ROLLBACK")
            assert ids(repo.search_messages(query, **filters)) == found  # and nothing was lost
    finally:
        blocker.close()
        engine.dispose()


DAMAGE = [
    ("messages_fts", "deploy", "UPDATE messages_fts_config SET v = 99 WHERE k = 'version'"),
    ("messages_fts", "deploy", "DROP TABLE messages_fts_idx"),
    ("messages_fts", "deploy", "UPDATE messages_fts_data SET block = x'ffffffffffffffff' WHERE id = 10"),
    ("messages_fts_trigram", "数据库迁移", "UPDATE messages_fts_trigram_config SET v = 99 WHERE k = 'version'"),
    ("messages_fts_trigram", "数据库迁移", "DROP TABLE messages_fts_trigram_idx"),
]


@pytest.mark.sqlite_only
@pytest.mark.parametrize(("index", "query", "damage"), DAMAGE)
def test_damaged_index_raises_instead_of_returning_nothing(
    fresh_corpus: SessionDB, tmp_path: Path, index: str, query: str, damage: str
) -> None:
    corpus = fresh_corpus
    assert corpus.search_messages(query)
    corpus.close()
    conn = sqlite3.connect(corpus.db_path)
    conn.execute(damage)
    conn.commit()
    conn.close()
    engine = create_engine(corpus.db_path)
    try:
        with engine.connect() as c, pytest.raises((DBAPIError, HermesStoreError)) as info:
            SearchRepository(c).search_messages(query)
        assert not is_query_syntax_error(info.value)
    finally:
        engine.dispose()
    reopened = SessionDB(corpus.db_path)
    try:
        with pytest.raises((DBAPIError, HermesStoreError)):
            reopened.search_messages(query)
    finally:
        reopened.close()


@pytest.fixture
def pg_corpus(pg_database: str):
    """The corpus on PostgreSQL, for the twins of the SQLite-only failure tests."""
    store = SessionDB(pg_database)
    try:
        build_corpus(store)
        store.append_message("tg1", "user", "un café, s'il vous plaît")  # a word query the server folds
        yield store
    finally:
        store.close()


@pytest.mark.parametrize(("query", "filters"), [*ROUTES, ("café", {})])
def test_locked_table_raises_instead_of_returning_nothing_on_postgresql(
    pg_corpus: SessionDB, query: str, filters: dict
) -> None:
    """PostgreSQL twin: a reader meets a lock only under ACCESS EXCLUSIVE (a DDL or
    LOCK TABLE elsewhere); with a lock timeout the search fails, it does not say []."""
    engine = pg_corpus.engine
    with engine.connect() as conn:
        repo = SearchRepository(conn)
        found = ids(repo.search_messages(query, **filters))
        assert found
        conn.rollback()
        with engine.connect() as blocker:
            blocker.execute(text("LOCK TABLE messages IN ACCESS EXCLUSIVE MODE"))
            conn.execute(text("SET lock_timeout = '50ms'"))
            with pytest.raises((DBAPIError, HermesStoreError), match="lock"):
                repo.search_messages(query, **filters)
            conn.rollback()
            blocker.rollback()
        assert ids(repo.search_messages(query, **filters)) == found  # and nothing was lost


@pytest.mark.parametrize(("query", "damage"), [
    ("café", "ALTER FUNCTION hermes_store_search_words(text) RENAME TO hermes_store_search_words_gone"),
    ("数据", "DROP TABLE messages_cjk_bigram_dirty"),
    ("deploy", "ALTER TABLE messages DROP COLUMN search_vector"),
])
def test_damaged_search_objects_raise_instead_of_returning_nothing_on_postgresql(
    pg_corpus: SessionDB, query: str, damage: str
) -> None:
    """PostgreSQL twin: a search object gone (by hand) is an error, never an empty answer."""
    assert pg_corpus.search_messages(query)
    with pg_corpus.engine.begin() as conn:
        conn.execute(text(damage))
    with pytest.raises((DBAPIError, HermesStoreError)):
        pg_corpus.search_messages(query)


@pytest.mark.parametrize("raw", ["C++", '"unterminated', "hello AND", "***", "a:b", "NEAR(a b, x)", "(" * 300 + "a"])
def test_fts5_syntax_errors_count_as_query_errors(raw: str) -> None:
    """The classifier is checked against what SQLite really says, not against our guesses."""
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE w USING fts5(content)")
    with pytest.raises(sqlite3.OperationalError) as info:
        conn.execute("SELECT rowid FROM w WHERE w MATCH ?", (raw,)).fetchall()
    conn.close()
    assert is_query_syntax_error(info.value)
    assert is_query_syntax_error(OperationalError("SELECT", {}, info.value))  # wrapped by SQLAlchemy too


@pytest.mark.parametrize(
    "error",
    [
        sqlite3.OperationalError("database is locked"),
        sqlite3.OperationalError("disk I/O error"),
        sqlite3.OperationalError("no such table: main.messages_fts_idx"),
        sqlite3.OperationalError("no such column: m.tool_calls"),
        sqlite3.OperationalError("invalid fts5 file format (found 99, expected 4) - run 'rebuild'"),
        sqlite3.OperationalError("database or disk is full"),
        sqlite3.DatabaseError("database disk image is malformed"),
        OperationalError("SELECT 1", {}, sqlite3.OperationalError("database is locked")),
    ],
)
def test_database_failures_are_not_query_errors(error: Exception) -> None:
    assert not is_query_syntax_error(error)


def test_odd_limits_and_filters_do_not_raise(corpus: SessionDB) -> None:
    assert ids(corpus.search_messages("deplo*", sort="oldest", limit=10**30, offset=0)) == [1, 3, 4, 6]
    assert ids(corpus.search_messages("deplo*", sort="oldest", limit=2, offset=10**30)) == []
    assert ids(corpus.search_messages("deplo*", sort="oldest", limit=-5)) == []
    assert ids(corpus.search_messages("deploy", source_filter=["cli\ud800"])) == []  # lone surrogate bound safely
    assert ids(corpus.search_messages("数据", exclude_sources="tele\udfffgram", sort="oldest")) == [3, 4, 5, 7]
