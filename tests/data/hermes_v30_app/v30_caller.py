"""A caller written the way Hermes v30's application reaches its session store: through
the provider factory and the contract's names only (it never imports hermes_store)."""

import json

from hermes_state_provider import SessionDBProvider, get_session_db_provider

import hermes_state


def main() -> None:
    db = get_session_db_provider()  # sessiondb.provider from $HERMES_HOME/config.yaml
    assert isinstance(db, SessionDBProvider)
    db.initialize()
    events = []
    db.add_post_write_hook(lambda: events.append("committed"))

    def audit(conn):
        if conn.execute("SELECT count(*) FROM messages WHERE content = 'forbidden'").fetchone()[0]:
            raise PermissionError("audit refused the write")

    db.add_pre_commit_hook(audit)
    db.create_session("v30", "cli", model="m")
    db.append_message("v30", "user", "hello from v30")
    try:
        db.append_message("v30", "user", "forbidden")
        vetoed = False
    except PermissionError:
        vetoed = True
    out = {
        "name": db.name,
        "available": db.is_available(),
        "vetoed": vetoed,
        "messages": [m["content"] for m in db.get_messages("v30")],
        "events": events,
        "found": [r["session_id"] for r in db.search_messages("hello")],
        "same_class": type(db) is hermes_state.SessionDB,
    }
    db.shutdown()
    out["after_shutdown"] = db.is_available()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
