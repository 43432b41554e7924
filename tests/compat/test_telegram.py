"""Telegram DM topic bindings (issue 13 point 4) through the swapped ``hermes_state``.

An opt-in schema step kept as Hermes keeps it: never applied on open;
``apply_telegram_topic_migration()`` creates the two tables. Before that every topic
method answers 0 / None / False / [] without raising or creating anything. Hermes
documents ``delete_telegram_topic_binding`` (reference §1.E); the other names are ours.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from .helpers import other_store
from sqlalchemy import text

pytestmark = pytest.mark.both_backends

TABLES = ("telegram_dm_topic_mode", "telegram_dm_topic_bindings")
SCHEMA_KEY = "telegram_dm_topic_schema_version"




@pytest.fixture
def topics(db):
    """A store with the topic tables and two sessions."""
    db.apply_telegram_topic_migration()
    db.create_session("s1", "telegram")
    db.create_session("s2", "telegram")
    return db


def tables_present(db) -> set[str]:
    from sqlalchemy import inspect

    return db._read(lambda c: {t for t in TABLES if inspect(c).has_table(t)})


def mode_row(db, chat: str) -> dict[str, Any] | None:
    rows = db._read(lambda c: [dict(r) for r in c.execute(
        text("SELECT enabled, updated_at FROM telegram_dm_topic_mode WHERE chat_id = :c"), {"c": chat}).mappings()])
    return rows[0] if rows else None


ALL_CALLS = {
    "has_telegram_topic_schema": ({}, False),
    "get_telegram_dm_topic_mode": ({"chat_id": 1}, False),
    "set_telegram_dm_topic_mode": ({"chat_id": 1, "enabled": True}, 0),
    "bind_telegram_topic": ({"chat_id": 1, "thread_id": 2, "user_id": "u1", "session_key": "k", "session_id": "s"},
                            None),
    "get_telegram_topic_binding": ({"chat_id": 1, "thread_id": 2}, None),
    "get_telegram_topic_bindings_for_session": ({"session_id": "s"}, []),
    "list_telegram_topic_bindings": ({"chat_id": 1}, []),
    "touch_telegram_topic_binding": ({"chat_id": 1, "thread_id": 2, "title": "t"}, 0),
    "delete_telegram_topic_binding": ({"chat_id": 1, "thread_id": 2}, 0),
}


# ---------------------------------------------------------------------- before the opt-in step


def test_opening_never_creates_the_topic_tables(db, hermes_state) -> None:
    assert tables_present(db) == set() and db.get_meta(SCHEMA_KEY) is None
    again = other_store(hermes_state, db)
    again.close()
    assert tables_present(db) == set()


@pytest.mark.parametrize("method", sorted(ALL_CALLS))
def test_every_topic_method_is_a_quiet_no_op_without_the_tables(db, method) -> None:
    db.create_session("s", "telegram")
    kwargs, expected = ALL_CALLS[method]
    got = getattr(db, method)(**kwargs)
    assert got == expected and type(got) is type(expected)
    assert tables_present(db) == set() and db.get_meta(SCHEMA_KEY) is None


def test_the_ten_topic_methods_take_keywords_only(db) -> None:
    import inspect

    names = [*ALL_CALLS, "apply_telegram_topic_migration"]
    assert len(names) == 10
    for name in names:
        params = list(inspect.signature(getattr(db, name)).parameters.values())
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params), name
    assert hasattr(type(db), "delete_telegram_topic_binding")  # Hermes' telegram adapter probes it


# ---------------------------------------------------------------------- the opt-in step


def test_apply_creates_both_tables_and_stamps_the_version_once(db) -> None:
    assert db.apply_telegram_topic_migration() is True
    assert tables_present(db) == set(TABLES)
    assert db.get_meta(SCHEMA_KEY) == "1"
    assert db.has_telegram_topic_schema() is True
    db.create_session("s", "telegram")
    db.bind_telegram_topic(chat_id=1, thread_id=2, user_id="u1", session_key="k", session_id="s")
    assert db.apply_telegram_topic_migration() is False  # idempotent: nothing re-created, data kept
    assert db.get_telegram_topic_binding(chat_id=1, thread_id=2)["session_id"] == "s"


def test_apply_keeps_a_version_stamp_already_there(db) -> None:
    """Hermes may have stamped its own version; the step only adds what is missing."""
    db._write(lambda c: c.execute(text("INSERT INTO state_meta (key, value) VALUES (:k, '7')"), {"k": SCHEMA_KEY}))
    assert db.apply_telegram_topic_migration() is True
    assert db.get_meta(SCHEMA_KEY) == "7" and tables_present(db) == set(TABLES)


def test_the_tables_are_not_in_the_models(hermes_state) -> None:
    from hermes_store.models import metadata
    from hermes_store.repositories.telegram import TOPIC_TABLES

    assert set(TOPIC_TABLES) == set(TABLES)
    assert not set(TABLES) & set(metadata.tables)


def test_a_store_opened_before_the_step_sees_the_tables_at_once(db, hermes_state) -> None:
    early = other_store(hermes_state, db)
    try:
        assert early.list_telegram_topic_bindings(chat_id=1) == []  # asked while absent
        db.apply_telegram_topic_migration()
        db.create_session("s", "telegram")
        early.bind_telegram_topic(chat_id=1, thread_id=2, user_id="u1", session_key="k", session_id="s")
        assert [b["thread_id"] for b in db.list_telegram_topic_bindings(chat_id=1)] == ["2"]
    finally:
        early.close()


def test_two_stores_applying_at_once_both_succeed_and_create_once(db, hermes_state) -> None:
    stores = [other_store(hermes_state, db) for _ in range(2)]
    barrier = threading.Barrier(2)
    results: list[Any] = []

    def apply(store) -> None:
        barrier.wait()
        try:
            results.append(store.apply_telegram_topic_migration())
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=apply, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    assert sorted(results, key=repr) == [False, True], results
    assert tables_present(db) == set(TABLES)


def test_alembic_check_stays_quiet_with_the_topic_tables(db) -> None:
    from alembic import command

    from hermes_store import alembic_support, migrations
    from hermes_store.repositories.telegram import TOPIC_TABLES

    db.apply_telegram_topic_migration()
    target = f"sqlite:///{db.db_path}" if db.db_path is not None else db.url.render_as_string(hide_password=False)
    command.check(migrations.make_config(target))  # raises AutogenerateDiffsDetected on any difference
    # A host's env.py hooks (branch mode, "ours first" mode) hide them too.
    assert alembic_support.OPT_IN_TABLES == frozenset(TOPIC_TABLES)
    for name in TOPIC_TABLES:
        assert not alembic_support.include_name(name, "table", {})
        assert not alembic_support.exclude_hermes_store(name, "table", {})


# ---------------------------------------------------------------------- DM topic mode


def test_topic_mode_is_off_until_set_and_keeps_bindings_when_turned_off(topics, clock) -> None:
    db = topics
    assert db.get_telegram_dm_topic_mode(chat_id=10) is False
    assert db.set_telegram_dm_topic_mode(chat_id=10) == 1
    assert db.get_telegram_dm_topic_mode(chat_id="10") is True
    assert mode_row(db, "10") == {"enabled": 1, "updated_at": clock.now}
    db.bind_telegram_topic(chat_id=10, thread_id=1, user_id="u1", session_key="k", session_id="s1")
    clock.now += 7
    db.set_telegram_dm_topic_mode(chat_id=10, enabled=False)
    assert mode_row(db, "10") == {"enabled": 0, "updated_at": clock.now}
    assert len(db.list_telegram_topic_bindings(chat_id=10)) == 1


# ---------------------------------------------------------------------- bindings


def test_bind_signature_is_hermes_v26(db) -> None:
    import inspect

    params = [(p.name, p.default) for p in inspect.signature(db.bind_telegram_topic).parameters.values()]
    empty = inspect.Parameter.empty
    assert params == [("chat_id", empty), ("thread_id", empty), ("user_id", empty), ("session_key", empty),
                      ("session_id", empty), ("managed_mode", "auto")]


def test_bind_stores_the_topic_as_text_and_turns_topic_mode_on(topics, clock) -> None:
    db = topics
    assert db.bind_telegram_topic(chat_id=-100123, thread_id=77, user_id=42, session_key="agent:main:tg:dm:42",
                                  session_id="s1", managed_mode="manual") is None
    assert db.get_telegram_topic_binding(chat_id="-100123", thread_id="77") == {
        "chat_id": "-100123", "thread_id": "77", "session_id": "s1", "title": None,
        "created_at": clock.now, "updated_at": clock.now, "user_id": "42", "session_key": "agent:main:tg:dm:42",
        "managed_mode": "manual",
    }
    assert db.get_telegram_dm_topic_mode(chat_id=-100123) is True


def test_rebinding_moves_the_topic_and_keeps_its_birth_and_title(topics, clock) -> None:
    db = topics
    db.bind_telegram_topic(chat_id=1, thread_id=2, user_id="u1", session_key="k", session_id="s1")
    db.touch_telegram_topic_binding(chat_id=1, thread_id=2, title="Plans")
    born = clock.now
    clock.now += 60
    db.bind_telegram_topic(chat_id=1, thread_id=2, user_id="u1", session_key="k2", session_id="s2")
    got = db.get_telegram_topic_binding(chat_id=1, thread_id=2)
    assert (got["session_id"], got["title"], got["created_at"], got["updated_at"], got["session_key"],
            got["managed_mode"]) == ("s2", "Plans", born, clock.now, "k2", "auto")
    assert db.get_telegram_topic_bindings_for_session(session_id="s1") == []


def test_binding_an_unknown_session_stores_nothing(topics) -> None:
    db = topics
    assert db.bind_telegram_topic(chat_id=1, thread_id=2, user_id="u1", session_key="k", session_id="ghost") is None
    assert db.get_telegram_topic_binding(chat_id=1, thread_id=2) is None
    assert db.get_telegram_dm_topic_mode(chat_id=1) is False


@pytest.mark.parametrize("bad", [{"chat_id": None}, {"thread_id": ""}, {"session_id": None},
                                 {"chat_id": 1.5}, {"managed_mode": 5}, {"user_id": 1.5}])
def test_bind_refuses_what_would_bind_a_topic_to_nothing(topics, hermes_state, bad) -> None:
    kwargs = {"chat_id": 1, "thread_id": 2, "user_id": "u1", "session_key": "k", "session_id": "s1", **bad}
    with pytest.raises(hermes_state.errors.InvalidInputError):
        topics.bind_telegram_topic(**kwargs)
    assert topics.list_telegram_topic_bindings(chat_id=1) == []


def test_listing_by_chat_and_by_session_oldest_binding_first(topics, clock) -> None:
    db = topics
    db.bind_telegram_topic(chat_id=1, thread_id=20, user_id="u1", session_key="k", session_id="s1")
    clock.now += 1
    db.bind_telegram_topic(chat_id=1, thread_id=3, user_id="u1", session_key="k", session_id="s2")
    clock.now += 1
    db.bind_telegram_topic(chat_id=2, thread_id=5, user_id="u1", session_key="k", session_id="s1")
    assert [b["thread_id"] for b in db.list_telegram_topic_bindings(chat_id=1)] == ["20", "3"]
    assert [(b["chat_id"], b["thread_id"]) for b in db.get_telegram_topic_bindings_for_session(session_id="s1")] \
        == [("1", "20"), ("2", "5")]
    assert db.list_telegram_topic_bindings(chat_id=99) == []
    assert db.get_telegram_topic_bindings_for_session(session_id="") == []
    assert db.get_telegram_topic_binding(chat_id=1, thread_id=None) is None


def test_touch_stamps_and_renames_only_a_bound_topic(topics, clock) -> None:
    db = topics
    db.bind_telegram_topic(chat_id=1, thread_id=2, user_id="u1", session_key="k", session_id="s1")
    db.touch_telegram_topic_binding(chat_id=1, thread_id=2, title="Old")
    born = clock.now
    clock.now += 30
    assert db.touch_telegram_topic_binding(chat_id=1, thread_id=2) == 1
    got = db.get_telegram_topic_binding(chat_id=1, thread_id=2)
    assert (got["title"], got["created_at"], got["updated_at"]) == ("Old", born, clock.now)
    assert db.touch_telegram_topic_binding(chat_id="1", thread_id="2", title="New") == 1
    assert db.get_telegram_topic_binding(chat_id=1, thread_id=2)["title"] == "New"
    assert db.touch_telegram_topic_binding(chat_id=1, thread_id=3) == 0
    assert db.touch_telegram_topic_binding(chat_id=None, thread_id=2) == 0


# ---------------------------------------------------------------------- delete (Hermes' method)


def test_delete_of_the_last_binding_turns_topic_mode_off_in_the_same_step(topics, clock) -> None:
    db = topics
    db.bind_telegram_topic(chat_id=1, thread_id=2, user_id="u1", session_key="k", session_id="s1")
    db.bind_telegram_topic(chat_id=1, thread_id=3, user_id="u1", session_key="k", session_id="s2")
    clock.now += 10
    assert db.delete_telegram_topic_binding(chat_id=1, thread_id=2) == 1
    assert mode_row(db, "1")["enabled"] == 1  # one binding left
    clock.now += 10
    assert db.delete_telegram_topic_binding(chat_id="1", thread_id=3) == 1
    assert mode_row(db, "1") == {"enabled": 0, "updated_at": clock.now}
    assert db.list_telegram_topic_bindings(chat_id=1) == []


def test_delete_of_an_unbound_topic_returns_0_and_leaves_the_mode(topics) -> None:
    db = topics
    db.set_telegram_dm_topic_mode(chat_id=1)
    assert db.delete_telegram_topic_binding(chat_id=1, thread_id=9) == 0
    assert db.get_telegram_dm_topic_mode(chat_id=1) is True
    assert db.delete_telegram_topic_binding(chat_id=None, thread_id=None) == 0


def test_delete_leaves_other_chats_alone(topics) -> None:
    db = topics
    db.bind_telegram_topic(chat_id=1, thread_id=2, user_id="u1", session_key="k", session_id="s1")
    db.bind_telegram_topic(chat_id=5, thread_id=2, user_id="u1", session_key="k", session_id="s1")
    db.delete_telegram_topic_binding(chat_id=1, thread_id=2)
    assert db.get_telegram_dm_topic_mode(chat_id=5) is True
    assert [b["chat_id"] for b in db.get_telegram_topic_bindings_for_session(session_id="s1")] == ["5"]


def test_concurrent_deletes_of_a_chats_last_two_topics_turn_the_mode_off(topics, hermes_state) -> None:
    """Each delete decides "was it the last?" under the chat's lock: two racing deletes
    cannot both see the other's binding still there."""
    db = topics
    stores = [other_store(hermes_state, db) for _ in range(2)]
    try:
        for round_ in range(8):
            chat = 1000 + round_
            db.bind_telegram_topic(chat_id=chat, thread_id=1, user_id="u1", session_key="k", session_id="s1")
            db.bind_telegram_topic(chat_id=chat, thread_id=2, user_id="u1", session_key="k", session_id="s2")
            barrier = threading.Barrier(2)
            results: list[Any] = []

            def drop(store, thread_id: int, chat=chat, barrier=barrier, results=results) -> None:
                barrier.wait()
                try:
                    results.append(store.delete_telegram_topic_binding(chat_id=chat, thread_id=thread_id))
                except Exception as exc:
                    results.append(exc)

            threads = [threading.Thread(target=drop, args=(stores[i], i + 1)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert results == [1, 1], results
            assert db.get_telegram_dm_topic_mode(chat_id=chat) is False, round_
    finally:
        for s in stores:
            s.close()


def test_deleting_a_session_drops_its_bindings(topics) -> None:
    db = topics
    db.bind_telegram_topic(chat_id=1, thread_id=2, user_id="u1", session_key="k", session_id="s1")
    db.bind_telegram_topic(chat_id=1, thread_id=3, user_id="u1", session_key="k", session_id="s2")
    assert db.delete_session("s1") is True
    assert [b["thread_id"] for b in db.list_telegram_topic_bindings(chat_id=1)] == ["3"]
    assert db.get_telegram_topic_binding(chat_id=1, thread_id=2) is None


# ---------------------------------------------------------------------- read-only


@pytest.mark.sqlite_only
def test_read_only_store_without_tables_answers_0_and_with_them_reads(db, hermes_state) -> None:
    db.create_session("s", "telegram")
    path = db.db_path
    ro = hermes_state.SessionDB(path, read_only=True)
    try:
        assert ro.delete_telegram_topic_binding(chat_id=1, thread_id=2) == 0
        assert ro.bind_telegram_topic(chat_id=1, thread_id=2, user_id="u1", session_key="k", session_id="s") is None
        db.apply_telegram_topic_migration()
        db.bind_telegram_topic(chat_id=1, thread_id=2, user_id="u1", session_key="k", session_id="s")
        assert ro.get_telegram_topic_binding(chat_id=1, thread_id=2)["session_id"] == "s"
        with pytest.raises(hermes_state.errors.ReadOnlyDatabaseError):
            ro.delete_telegram_topic_binding(chat_id=1, thread_id=2)
        with pytest.raises(hermes_state.errors.ReadOnlyDatabaseError):
            ro.apply_telegram_topic_migration()
    finally:
        ro.close()


def test_apply_adds_the_v26_columns_to_an_older_bindings_table(db) -> None:
    """A bindings table made before v26 (no user, key or mode) still binds; applying the
    step again adds the three nullable columns in place, rows kept."""
    db.apply_telegram_topic_migration()
    db._write(lambda c: c.execute(text("DROP TABLE telegram_dm_topic_bindings")))
    db._write(lambda c: c.execute(text(
        "CREATE TABLE telegram_dm_topic_bindings (chat_id TEXT NOT NULL, thread_id TEXT NOT NULL,"
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE, title TEXT,"
        " created_at DOUBLE PRECISION, updated_at DOUBLE PRECISION, PRIMARY KEY (chat_id, thread_id))")))
    db.create_session("s", "telegram")
    db.bind_telegram_topic(chat_id=1, thread_id=2, user_id="u1", session_key="k", session_id="s")
    db.touch_telegram_topic_binding(chat_id=1, thread_id=2, title="Kept")
    assert "session_key" not in db.get_telegram_topic_binding(chat_id=1, thread_id=2)
    assert db.apply_telegram_topic_migration() is False
    db.bind_telegram_topic(chat_id=1, thread_id=2, user_id="u1", session_key="k9", session_id="s")
    got = db.get_telegram_topic_binding(chat_id=1, thread_id=2)
    assert (got["title"], got["user_id"], got["session_key"], got["managed_mode"]) == ("Kept", "u1", "k9", "auto")
