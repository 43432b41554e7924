"""Search through SessionDB: routing, snippets, context, filters, and fuzzing."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_store import SessionDB

from .conftest import set_times


@pytest.fixture
def corpus(db: SessionDB) -> SessionDB:
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
    for i, (sid, role, content, extra) in enumerate(rows):
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


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.sampled_from(list('abc 数据库迁移"*:^+-(){}._%\\\'ANDORTNEAR\x00🙂한글かな\ud800')) | st.characters(), max_size=40))
def test_search_never_raises(corpus: SessionDB, query: str) -> None:
    result = corpus.search_messages(query, sort="newest")
    assert isinstance(result, list)
    for hit in result:
        assert isinstance(hit["snippet"], str)


def test_snippet_comes_from_the_matching_column(corpus: SessionDB) -> None:
    hit = next(h for h in corpus.search_messages("kubectl") if h["id"] == 2)
    assert ">>>kubectl<<<" in hit["snippet"]  # content is NULL: the tool_calls column matched
    tool = next(h for h in corpus.search_messages("terminal", role_filter=["tool"]))
    assert tool["tool_name"] == "terminal" and ">>>terminal<<<" in tool["snippet"]


def test_trigram_hits_and_tool_rows_merge_in_order_and_pages(db: SessionDB) -> None:
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
    assert set(ranked) == set(ids) and set(ranked[:4]) == set(ids[0::2])  # ranked index hits first
    assert [h["id"] for h in db.search_messages("数据库迁移", limit=2, offset=3)] == ranked[3:5]
