"""A small caller written the way Hermes' own application code is (agent/insights.py,
hermes_cli/web_server.py, gateway/platforms/api_server.py, gateway/run.py), to prove
the one-line swap: it only knows ``hermes_state``."""

import asyncio
import sqlite3

from hermes_state import AsyncSessionDB, SessionDB, format_session_db_unavailable


class InsightsEngine:
    def __init__(self, db):
        self._conn = db._conn

    def tool_usage(self, days_cutoff):
        cursor = self._conn.execute(
            """SELECT m.tool_name, COUNT(*) AS count FROM messages m
               JOIN sessions s ON s.id = m.session_id
               WHERE s.started_at >= ? AND m.role = 'tool' AND m.tool_name IS NOT NULL
               GROUP BY m.tool_name ORDER BY count DESC, m.tool_name""",
            (days_cutoff,),
        )
        return [dict(row) for row in cursor.fetchall()]

    def model_usage(self):
        try:
            rows = self._conn.execute(
                """SELECT u.model, SUM(u.input_tokens) AS input_tokens FROM session_model_usage u
                   JOIN sessions s ON s.id = u.session_id GROUP BY u.model ORDER BY u.model"""
            ).fetchall()
        except sqlite3.OperationalError:
            return []
        return [(row["model"], row["input_tokens"]) for row in rows]

    def daily(self):
        rows = self._conn.execute(
            "SELECT date(started_at, 'unixepoch') AS day, COUNT(*) AS n FROM sessions GROUP BY day"
        ).fetchall()
        return {row["day"]: row["n"] for row in rows}


def reopen_like_the_cli(db, session_id):
    try:
        db._conn.execute("UPDATE sessions SET ended_at = NULL, end_reason = NULL WHERE id = ?", (session_id,))
        db._conn.commit()
    except Exception:
        pass


def create_with_title_like_the_api_server(db, session_id, title):
    title = db.sanitize_title(title)

    def _do(conn):
        if conn.execute("SELECT id FROM sessions WHERE id = ?", (session_id,)).fetchone():
            raise ValueError("exists")
        conn.execute(
            "INSERT INTO sessions (id, source, model, system_prompt, started_at) VALUES (?, ?, ?, ?, ?)",
            (session_id, "api_server", "m", None, 1000.0),
        )
        conflict = conn.execute("SELECT id FROM sessions WHERE title = ? AND id != ?", (title, session_id)).fetchone()
        if conflict:
            conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
            return ("conflict", conflict["id"])
        conn.execute("UPDATE sessions SET title = ? WHERE id = ?", (title, session_id))
        return ("created", dict(conn.execute("SELECT * FROM sessions WHERE id = ?", (session_id,)).fetchone()))

    return db._execute_write(_do)


def gateway_roundtrip(db, session_id):
    wrapped = AsyncSessionDB(db)

    async def main():
        await wrapped.append_message(session_id, "user", "from the gateway")
        raw = getattr(wrapped, "_db", wrapped)
        return type(raw) is SessionDB, await wrapped.message_count(session_id)

    return asyncio.run(main())


def unavailable_text():
    return format_session_db_unavailable()
