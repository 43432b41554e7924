"""The systems bench/peers.py compares: one adapter each, used as its own docs show.

Every adapter offers the same calls (``open``, ``load``, ``append``, ``read``,
``search``, ``list_sessions``, ``writer``, ``count``, ``close``); an async system's are
coroutines. Peer packages are imported inside their adapter's ``open`` only, so this
module (and ``peers.py --help`` / ``--smoke``) imports without them.

What a peer has no API for, the adapter does as a user of that peer would: a word
search is a LIKE scan over the peer's own table (``ILIKE`` on PostgreSQL, where LIKE is
case-sensitive), and a listing is a query over its session table (LangChain has none:
it groups its message table by session). Each adapter's ``notes`` say so, and peers.py
prints them under the table.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from typing import Any

LIMIT = 20


def pg_url(url: str, driver: str) -> str:
    """The SQLAlchemy URL of ``url``'s database with another driver (asyncpg, psycopg)."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername=f"postgresql+{driver}").render_as_string(hide_password=False)


def pg_conninfo(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


# --------------------------------------------------------------------------- hermes_store

class Ours:
    """hermes_store's ``SessionDB``, as README shows; 8 writer threads share one store."""

    name = "hermes_store"
    is_async = False
    writers_model = "8 threads, one SessionDB"

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.notes = {"search": "FTS (SQLite FTS5 / PostgreSQL tsvector), 20 hits with snippets and context",
                      "list": "list_sessions_rich(limit=20): lineage-aware, previews, last_active"}

    def open(self, target: str) -> None:
        from hermes_store import SessionDB

        self.db = SessionDB(target)
        self.notes["driver"] = "sqlite3" if self.backend == "sqlite" else str(self.db.engine.url.drivername)

    def load(self, sid: str, msgs: list[dict[str, Any]]) -> None:
        self.db.create_session(sid, "cli")
        self.db.append_messages_batch(sid, [dict(m) for m in msgs])

    def settle(self) -> None:
        """After the load: let the store's own upkeep of it (index catch-up off the
        callers' path) finish, so reads are timed on a settled store."""
        self.db.wait_for_upkeep(60)

    def create(self, sid: str) -> None:
        self.db.create_session(sid, "cli")

    def append(self, sid: str, m: dict[str, Any]) -> Any:
        return self.db.append_message(sid, **m)

    def read(self, sid: str) -> list[Any]:
        return self.db.get_messages_as_conversation(sid)

    def search(self, word: str) -> list[Any]:
        return self.db.search_messages(word, limit=LIMIT)

    def list_sessions(self) -> list[Any]:
        return self.db.list_sessions_rich(limit=LIMIT)

    def writer(self, sid: str) -> Any:
        db = self.db
        return lambda m: db.append_message(sid, **m)

    def rows_for(self, m: dict[str, Any]) -> int:
        return 1

    def count(self, sid: str) -> tuple[int, int | None]:
        """(rows stored for ``sid``, the session's own message counter)."""
        row = self.db.get_session(sid) or {}
        return self.db.message_count(sid), row.get("message_count")

    def close(self) -> None:
        self.db.close()


class OursAsync:
    """``hermes_store.aio.AsyncSessionDB``: every call awaited; 8 writer tasks share it."""

    name = "hermes_store.aio"
    is_async = True
    writers_model = "8 tasks, one AsyncSessionDB"

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.notes = dict(Ours(backend).notes)

    async def open(self, target: str) -> None:
        from hermes_store.aio import AsyncSessionDB

        self.db = AsyncSessionDB(target)
        await self.db.open()
        self.notes["driver"] = str(self.db.url.drivername) if self.db.url is not None else "?"

    async def load(self, sid: str, msgs: list[dict[str, Any]]) -> None:
        await self.db.create_session(sid, "cli")
        await self.db.append_messages_batch(sid, [dict(m) for m in msgs])

    async def settle(self) -> None:
        await self.db.wait_for_upkeep(60)

    async def create(self, sid: str) -> None:
        await self.db.create_session(sid, "cli")

    async def append(self, sid: str, m: dict[str, Any]) -> Any:
        return await self.db.append_message(sid, **m)

    async def read(self, sid: str) -> list[Any]:
        return await self.db.get_messages_as_conversation(sid)

    async def search(self, word: str) -> list[Any]:
        return await self.db.search_messages(word, limit=LIMIT)

    async def list_sessions(self) -> list[Any]:
        return await self.db.list_sessions_rich(limit=LIMIT)

    def writer(self, sid: str) -> Any:
        db = self.db

        async def append(m: dict[str, Any]) -> Any:
            return await db.append_message(sid, **m)

        return append

    def rows_for(self, m: dict[str, Any]) -> int:
        return 1

    async def count(self, sid: str) -> tuple[int, int | None]:
        row = await self.db.get_session(sid) or {}
        return await self.db.message_count(sid), row.get("message_count")

    async def close(self) -> None:
        await self.db.close()


# --------------------------------------------------------------------------- OpenAI Agents SDK

def openai_items(m: dict[str, Any]) -> list[dict[str, Any]]:
    """One Hermes-shaped message as the items the Agents SDK's Runner stores for it.

    User and system turns are easy input messages; an assistant turn is an output
    message (when it has text) and one ``function_call`` item per call; a tool result is
    a ``function_call_output``. All the items of one message go in one ``add_items``
    call, as the Runner adds a turn's items together.
    """
    role = m["role"]
    if role in ("user", "system"):
        return [{"role": role, "content": m.get("content") or ""}]
    if role == "tool":
        return [{"type": "function_call_output", "call_id": m["tool_call_id"], "output": m.get("content") or ""}]
    items: list[dict[str, Any]] = []
    if m.get("content"):
        items.append({"type": "message", "role": "assistant", "status": "completed",
                      "content": [{"type": "output_text", "text": m["content"], "annotations": []}]})
    for c in m.get("tool_calls") or ():
        items.append({"type": "function_call", "call_id": c["id"], "name": c["function"]["name"],
                      "arguments": c["function"]["arguments"], "status": "completed"})
    return items


class _OpenAIBase:
    is_async = True
    writers_model = "8 tasks, one session object each"

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.sessions: dict[str, Any] = {}
        self.notes = {"search": "no search API: LIKE scan over agent_messages.message_data (JSON), newest 20",
                      "list": "no listing API: agent_sessions ORDER BY updated_at DESC LIMIT 20"}

    def _session(self, sid: str) -> Any:
        raise NotImplementedError

    def session(self, sid: str) -> Any:
        s = self.sessions.get(sid)
        if s is None:
            s = self.sessions[sid] = self._session(sid)
        return s

    async def load(self, sid: str, msgs: list[dict[str, Any]]) -> None:
        await self.session(sid).add_items([it for m in msgs for it in openai_items(m)])

    async def create(self, sid: str) -> None:
        self.session(sid)

    async def append(self, sid: str, m: dict[str, Any]) -> None:
        await self.session(sid).add_items(openai_items(m))

    async def read(self, sid: str) -> list[Any]:
        return list(await self.session(sid).get_items())

    def writer(self, sid: str) -> Any:
        s = self.session(sid)

        async def append(m: dict[str, Any]) -> None:
            await s.add_items(openai_items(m))

        return append

    def rows_for(self, m: dict[str, Any]) -> int:
        return len(openai_items(m))


class OpenAISQLite(_OpenAIBase):
    """``agents.SQLiteSession(session_id, db_path)``: one object per conversation on one file.

    It turns WAL on itself and serializes the file's writers in-process (one lock per
    file, each call on a worker thread through ``asyncio.to_thread``)."""

    name = "SQLiteSession"

    async def open(self, target: str) -> None:
        import agents

        self.path = target
        self.cls = agents.SQLiteSession
        self.reader = sqlite3.connect(target, check_same_thread=False)  # the user's own queries
        self.notes["driver"] = "sqlite3"
        self.notes["version"] = f"openai-agents {agents.__version__}" if hasattr(agents, "__version__") else ""

    def _session(self, sid: str) -> Any:
        return self.cls(sid, self.path)

    async def search(self, word: str) -> list[Any]:
        return self.reader.execute(
            "SELECT session_id, message_data FROM agent_messages WHERE message_data LIKE ? ORDER BY id DESC LIMIT ?",
            (f"%{word}%", LIMIT)).fetchall()

    async def list_sessions(self) -> list[Any]:
        return self.reader.execute(
            "SELECT session_id, created_at, updated_at FROM agent_sessions ORDER BY updated_at DESC LIMIT ?",
            (LIMIT,)).fetchall()

    async def count(self, sid: str) -> tuple[int, int | None]:
        n = self.reader.execute("SELECT COUNT(*) FROM agent_messages WHERE session_id = ?", (sid,)).fetchone()[0]
        return int(n), None

    async def close(self) -> None:
        for s in self.sessions.values():
            s.close()
        self.reader.close()


class OpenAISQLAlchemy(_OpenAIBase):
    """``agents.extensions.memory.SQLAlchemySession(session_id, engine=..., create_tables=True)``:
    one object per conversation on the application's one AsyncEngine (aiosqlite /
    asyncpg), as its docs show for an engine the application manages."""

    name = "SQLAlchemySession"

    async def open(self, target: str) -> None:
        from agents.extensions.memory import SQLAlchemySession
        from sqlalchemy.ext.asyncio import create_async_engine

        url = f"sqlite+aiosqlite:///{target}" if self.backend == "sqlite" else pg_url(target, "asyncpg")
        self.engine = create_async_engine(url)
        self.cls = SQLAlchemySession
        self.notes["driver"] = self.engine.url.drivername
        self.like = "LIKE" if self.backend == "sqlite" else "ILIKE"

    def _session(self, sid: str) -> Any:
        return self.cls(sid, engine=self.engine, create_tables=True)

    async def _rows(self, sql: str, **params: Any) -> list[Any]:
        from sqlalchemy import text

        async with self.engine.connect() as c:
            return list((await c.execute(text(sql), params)).all())

    async def search(self, word: str) -> list[Any]:
        return await self._rows("SELECT session_id, message_data FROM agent_messages "
                                f"WHERE message_data {self.like} :w ORDER BY id DESC LIMIT :n", w=f"%{word}%", n=LIMIT)

    async def list_sessions(self) -> list[Any]:
        return await self._rows("SELECT session_id, created_at, updated_at FROM agent_sessions "
                                "ORDER BY updated_at DESC LIMIT :n", n=LIMIT)

    async def count(self, sid: str) -> tuple[int, int | None]:
        rows = await self._rows("SELECT COUNT(*) FROM agent_messages WHERE session_id = :s", s=sid)
        return int(rows[0][0]), None

    async def close(self) -> None:
        await self.engine.dispose()


# --------------------------------------------------------------------------- LangChain

def langchain_message(m: dict[str, Any]) -> Any:
    """One Hermes-shaped message as LangChain's message class for its role."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    role = m["role"]
    content = m.get("content") or ""
    if role == "user":
        return HumanMessage(content)
    if role == "system":
        return SystemMessage(content)
    if role == "tool":
        return ToolMessage(content, tool_call_id=m["tool_call_id"], name=m.get("tool_name"))
    calls = [{"name": c["function"]["name"], "args": json.loads(c["function"]["arguments"]), "id": c["id"],
              "type": "tool_call"} for c in m.get("tool_calls") or ()]
    return AIMessage(content, tool_calls=calls)


class LangChainSQL:
    """``SQLChatMessageHistory(session_id=..., connection=engine)``: its sync API, one
    history object per conversation on the application's one Engine (SQLite: pysqlite
    with SQLite's default journal, which LangChain leaves as it is; PostgreSQL: psycopg)."""

    name = "SQLChatMessageHistory"
    is_async = False
    writers_model = "8 threads, one history object each"

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.histories: dict[str, Any] = {}
        self.notes = {"search": "no search API: LIKE scan over message_store.message (JSON), newest 20",
                      "list": "no session table: message_store GROUP BY session_id ORDER BY MAX(id) DESC LIMIT 20"}

    def open(self, target: str) -> None:
        from langchain_community.chat_message_histories import SQLChatMessageHistory
        from sqlalchemy import create_engine

        url = f"sqlite:///{target}" if self.backend == "sqlite" else pg_url(target, "psycopg")
        self.engine = create_engine(url)
        self.cls = SQLChatMessageHistory
        self.notes["driver"] = self.engine.url.drivername
        self.like = "LIKE" if self.backend == "sqlite" else "ILIKE"

    def history(self, sid: str) -> Any:
        h = self.histories.get(sid)
        if h is None:
            h = self.histories[sid] = self.cls(session_id=sid, connection=self.engine)
        return h

    def load(self, sid: str, msgs: list[dict[str, Any]]) -> None:
        self.history(sid).add_messages([langchain_message(m) for m in msgs])

    def create(self, sid: str) -> None:
        self.history(sid)

    def append(self, sid: str, m: dict[str, Any]) -> None:
        self.history(sid).add_message(langchain_message(m))

    def read(self, sid: str) -> list[Any]:
        return self.history(sid).messages

    def _rows(self, sql: str, **params: Any) -> list[Any]:
        from sqlalchemy import text

        with self.engine.connect() as c:
            return list(c.execute(text(sql), params).all())

    def search(self, word: str) -> list[Any]:
        return self._rows(f"SELECT session_id, message FROM message_store WHERE message {self.like} :w "
                          "ORDER BY id DESC LIMIT :n", w=f"%{word}%", n=LIMIT)

    def list_sessions(self) -> list[Any]:
        return self._rows("SELECT session_id, MAX(id) AS last FROM message_store GROUP BY session_id "
                          "ORDER BY last DESC LIMIT :n", n=LIMIT)

    def writer(self, sid: str) -> Any:
        h = self.history(sid)
        return lambda m: h.add_message(langchain_message(m))

    def rows_for(self, m: dict[str, Any]) -> int:
        return 1

    def count(self, sid: str) -> tuple[int, int | None]:
        rows = self._rows("SELECT COUNT(*) FROM message_store WHERE session_id = :s", s=sid)
        return int(rows[0][0]), None

    def close(self) -> None:
        self.engine.dispose()


# --------------------------------------------------------------------------- the floor

_FLOOR_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, created_at DOUBLE PRECISION NOT NULL, "
    "updated_at DOUBLE PRECISION NOT NULL, message_count INTEGER NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS messages (id {serial} PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id), "
    "role TEXT NOT NULL, content TEXT, tool_calls TEXT, tool_name TEXT, tool_call_id TEXT, "
    "created_at DOUBLE PRECISION NOT NULL)",
    "CREATE INDEX IF NOT EXISTS messages_session ON messages (session_id, id)",
    "CREATE INDEX IF NOT EXISTS sessions_updated ON sessions (updated_at)",
)
_INSERT = ("INSERT INTO messages (session_id, role, content, tool_calls, tool_name, tool_call_id, created_at) "
           "VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p})")
_BUMP = "UPDATE sessions SET message_count = message_count + {n}, updated_at = {p} WHERE id = {p}"


def _row(sid: str, m: dict[str, Any], now: float) -> tuple[Any, ...]:
    calls = m.get("tool_calls")
    return (sid, m["role"], m.get("content"), json.dumps(calls) if calls else None, m.get("tool_name"),
            m.get("tool_call_id"), now)


class Floor:
    """The plain driver (``sqlite3`` / ``psycopg``) doing the same five operations on a
    minimal two-table store: what these operations cost with nothing above the driver.

    SQLite: WAL, ``synchronous=NORMAL``, a transaction per append (``BEGIN IMMEDIATE``,
    insert, counter bump), one connection per thread, and the writers of the process
    taking turns through one ``threading.Lock`` (so they never meet SQLite's busy
    handler). PostgreSQL: one psycopg connection per thread, autocommit for reads,
    ``BEGIN``/``COMMIT`` around each append. Search: a LIKE scan over content and tool
    calls; listing: the sessions index, with the first user message as a preview."""

    is_async = False
    writers_model = "8 threads, a connection each"

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.name = "sqlite3" if backend == "sqlite" else "psycopg"
        self.p = "?" if backend == "sqlite" else "%s"
        self.like = "LIKE" if backend == "sqlite" else "ILIKE"
        self.local = threading.local()
        self.conns: list[Any] = []
        self.write_lock = threading.Lock() if backend == "sqlite" else None
        self.notes = {"search": "LIKE scan over content and tool_calls, newest 20",
                      "list": "sessions ORDER BY updated_at DESC LIMIT 20, with the first user message",
                      "driver": self.name}

    def _connect(self) -> Any:
        if self.backend == "sqlite":
            c = sqlite3.connect(self.target, isolation_level=None, check_same_thread=False)
            c.execute("PRAGMA journal_mode=WAL")
            c.execute("PRAGMA synchronous=NORMAL")
            c.execute("PRAGMA foreign_keys=ON")
            c.execute("PRAGMA busy_timeout=60000")
        else:
            import psycopg

            c = psycopg.connect(pg_conninfo(self.target), autocommit=True)
        self.conns.append(c)
        return c

    @property
    def conn(self) -> Any:
        c = getattr(self.local, "conn", None)
        if c is None:
            c = self.local.conn = self._connect()
        return c

    def open(self, target: str) -> None:
        self.target = target
        serial = "INTEGER" if self.backend == "sqlite" else "BIGSERIAL"
        for sql in _FLOOR_SCHEMA:
            self.conn.execute(sql.format(serial=serial))
        self.insert = _INSERT.format(p=self.p)

    def _write(self, c: Any, sid: str, msgs: list[dict[str, Any]], *, create: bool = False) -> None:
        now = time.time()
        if self.write_lock is not None:
            with self.write_lock:
                c.execute("BEGIN IMMEDIATE")
                try:
                    self._statements(c, sid, msgs, now, create)
                    c.execute("COMMIT")
                except BaseException:
                    c.execute("ROLLBACK")
                    raise
            return
        with c.transaction():
            self._statements(c, sid, msgs, now, create)

    def _statements(self, c: Any, sid: str, msgs: list[dict[str, Any]], now: float, create: bool) -> None:
        p = self.p
        if create:
            c.execute(f"INSERT INTO sessions (id, created_at, updated_at) VALUES ({p}, {p}, {p})", (sid, now, now))
        if len(msgs) == 1:
            c.execute(self.insert, _row(sid, msgs[0], now))
        elif msgs:
            cur = c.cursor()
            cur.executemany(self.insert, [_row(sid, m, now) for m in msgs])
        if msgs:
            c.execute(_BUMP.format(n=len(msgs), p=p), (now, sid))

    def load(self, sid: str, msgs: list[dict[str, Any]]) -> None:
        self._write(self.conn, sid, msgs, create=True)

    def create(self, sid: str) -> None:
        self._write(self.conn, sid, [], create=True)

    def append(self, sid: str, m: dict[str, Any]) -> None:
        self._write(self.conn, sid, [m])

    def read(self, sid: str) -> list[dict[str, Any]]:
        rows = self.conn.execute(
            f"SELECT role, content, tool_calls, tool_name, tool_call_id FROM messages WHERE session_id = {self.p} "
            "ORDER BY id", (sid,)).fetchall()
        out = []
        for role, content, calls, tool_name, call_id in rows:
            d: dict[str, Any] = {"role": role, "content": content}
            if calls:
                d["tool_calls"] = json.loads(calls)
            if call_id:
                d["tool_call_id"], d["tool_name"] = call_id, tool_name
            out.append(d)
        return out

    def search(self, word: str) -> list[Any]:
        p, like = self.p, self.like
        return self.conn.execute(
            f"SELECT id, session_id, role, content FROM messages WHERE content {like} {p} OR tool_calls {like} {p} "
            f"ORDER BY id DESC LIMIT {p}", (f"%{word}%", f"%{word}%", LIMIT)).fetchall()

    def list_sessions(self) -> list[Any]:
        p = self.p
        return self.conn.execute(
            "SELECT s.id, s.updated_at, s.message_count, (SELECT substr(m.content, 1, 60) FROM messages m "
            "WHERE m.session_id = s.id AND m.role = 'user' ORDER BY m.id LIMIT 1) "
            f"FROM sessions s ORDER BY s.updated_at DESC LIMIT {p}", (LIMIT,)).fetchall()

    def writer(self, sid: str) -> Any:
        return lambda m: self._write(self.conn, sid, [m])

    def rows_for(self, m: dict[str, Any]) -> int:
        return 1

    def count(self, sid: str) -> tuple[int, int | None]:
        p = self.p
        n = self.conn.execute(f"SELECT COUNT(*) FROM messages WHERE session_id = {p}", (sid,)).fetchone()[0]
        row = self.conn.execute(f"SELECT message_count FROM sessions WHERE id = {p}", (sid,)).fetchone()
        return int(n), (int(row[0]) if row else None)

    def close(self) -> None:
        for c in self.conns:
            c.close()


#: name on the command line -> adapter class; the order is the table's column order.
SYSTEMS: dict[str, Any] = {
    "ours": Ours,
    "aio": OursAsync,
    "sqlitesession": OpenAISQLite,
    "sqlalchemysession": OpenAISQLAlchemy,
    "langchain": LangChainSQL,
    "floor": Floor,
}
#: Systems with no PostgreSQL form.
SQLITE_ONLY = ("sqlitesession",)
#: Systems that need no peer package (what ``--smoke`` runs).
OWN = ("ours", "aio", "floor")
