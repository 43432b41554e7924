"""PostgreSQL keeps ``messages.display_order`` as Hermes v30's triggers keep it on SQLite.

Why this revision exists: Hermes v30 (revision 0030) gave messages a stable on-screen
position, ``display_order``, maintained by four SQLite triggers: a new row takes the
order of a visible peer with the same ``display_identity`` (else its own id); a row
that becomes visible or hidden (``active``/``compacted``) joins or leaves its peers;
an edit that changes what the row shows clears its identity and order; a deleted
visible row hands its order to the lowest remaining peer. hs0002 made the PostgreSQL
schema without them, so on a server ``display_order`` stayed NULL and a history
copied from a server to a file differed from one written to the file directly.

What it does, on PostgreSQL only (SQLite has Hermes' own triggers since 0030):

* ``hermes_store_display_order_insert()``, a BEFORE INSERT row trigger: the same
  choice as Hermes' AFTER INSERT one, made on the row before it is stored (its
  identity default is already assigned), so an insert is not followed by an update.
* ``hermes_store_display_visibility_update()``, ``hermes_store_display_identity_update()``,
  ``hermes_store_display_identity_delete()``: AFTER row triggers with Hermes' three
  statements each, SQLite's ``MIN(a, b)`` written ``LEAST`` and ``IS NOT`` written
  ``IS DISTINCT FROM``. Their own updates touch only ``display_order`` /
  ``display_identity``, outside the columns the UPDATE triggers listen to, so they never
  fire one another (as SQLite's, which do not recurse).

Functions and triggers are not in the models and autogenerate does not compare them.
The downgrade drops exactly these four triggers and functions.
"""

from alembic import op

revision = "hs0004"
down_revision = "hs0003"
branch_labels = None
depends_on = None

VISIBLE = "(active = 1 OR compacted = 1)"

FUNCTIONS = {
    "hermes_store_display_order_insert": f"""
BEGIN
    IF NEW.display_order IS NULL THEN
        NEW.display_order := COALESCE((
            SELECT display_order FROM messages
            WHERE session_id = NEW.session_id AND id <> NEW.id AND {VISIBLE}
              AND display_identity = NEW.display_identity AND display_order IS NOT NULL
            ORDER BY display_order LIMIT 1
        ), NEW.id);
    END IF;
    RETURN NEW;
END""",
    "hermes_store_display_visibility_update": f"""
BEGIN
    IF (NEW.active = 1 OR NEW.compacted = 1) THEN
        UPDATE messages SET display_order = LEAST(NEW.id, COALESCE((
            SELECT display_order FROM messages
            WHERE session_id = NEW.session_id AND id <> NEW.id AND {VISIBLE}
              AND display_identity = NEW.display_identity AND display_order IS NOT NULL
            ORDER BY display_order LIMIT 1
        ), NEW.id)) WHERE id = NEW.id;
        UPDATE messages SET display_order = (SELECT m.display_order FROM messages m WHERE m.id = NEW.id)
        WHERE session_id = NEW.session_id AND id <> NEW.id AND {VISIBLE}
          AND display_identity = NEW.display_identity;
    ELSE
        UPDATE messages SET display_order = (
            SELECT MIN(peer.id) FROM messages AS peer
            WHERE peer.session_id = OLD.session_id AND (peer.active = 1 OR peer.compacted = 1)
              AND peer.display_identity = OLD.display_identity
        ) WHERE session_id = OLD.session_id AND {VISIBLE}
          AND display_identity = OLD.display_identity;
    END IF;
    RETURN NULL;
END""",
    "hermes_store_display_identity_update": f"""
BEGIN
    UPDATE messages SET display_identity = NULL, display_order = NULL
    WHERE id = NEW.id OR (
        session_id = OLD.session_id AND display_identity = OLD.display_identity AND {VISIBLE}
    );
    RETURN NULL;
END""",
    "hermes_store_display_identity_delete": f"""
BEGIN
    UPDATE messages SET display_order = (
        SELECT MIN(peer.id) FROM messages AS peer
        WHERE peer.session_id = OLD.session_id AND (peer.active = 1 OR peer.compacted = 1)
          AND peer.display_identity = OLD.display_identity
    ) WHERE session_id = OLD.session_id AND {VISIBLE}
      AND display_identity = OLD.display_identity;
    RETURN NULL;
END""",
}

TRIGGERS = {
    # Hermes' trigger names, so tools that look for them by name find them here too.
    "messages_display_order_insert": (
        "BEFORE INSERT ON messages FOR EACH ROW",
        "hermes_store_display_order_insert",
    ),
    "messages_display_visibility_update": (
        "AFTER UPDATE OF active, compacted ON messages FOR EACH ROW"
        " WHEN ((NEW.active = 1 OR NEW.compacted = 1) IS DISTINCT FROM (OLD.active = 1 OR OLD.compacted = 1))",
        "hermes_store_display_visibility_update",
    ),
    "messages_display_identity_update": (
        "AFTER UPDATE OF role, content, timestamp, tool_call_id, tool_calls, tool_name, display_kind"
        " ON messages FOR EACH ROW WHEN (NEW.role IS DISTINCT FROM OLD.role"
        " OR NEW.content IS DISTINCT FROM OLD.content OR NEW.timestamp IS DISTINCT FROM OLD.timestamp"
        " OR NEW.tool_call_id IS DISTINCT FROM OLD.tool_call_id OR NEW.tool_calls IS DISTINCT FROM OLD.tool_calls"
        " OR NEW.tool_name IS DISTINCT FROM OLD.tool_name OR NEW.display_kind IS DISTINCT FROM OLD.display_kind)",
        "hermes_store_display_identity_update",
    ),
    "messages_display_identity_delete": (
        "AFTER DELETE ON messages FOR EACH ROW WHEN (OLD.active = 1 OR OLD.compacted = 1)",
        "hermes_store_display_identity_delete",
    ),
}


def _on_postgresql() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def upgrade() -> None:
    if not _on_postgresql():
        return  # SQLite: Hermes' own triggers (revision 0030)
    for name, body in FUNCTIONS.items():
        op.execute(f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $${body}\n$$")
    for trigger, (when, function) in TRIGGERS.items():
        op.execute(f"CREATE TRIGGER {trigger} {when} EXECUTE FUNCTION {function}()")
    # Rows written before stay NULL ("pending"), as 0030 leaves older rows on SQLite.


def downgrade() -> None:
    if not _on_postgresql():
        return  # nothing was made on SQLite
    for trigger in TRIGGERS:
        op.execute(f"DROP TRIGGER {trigger} ON messages")
    for name in FUNCTIONS:
        op.execute(f"DROP FUNCTION {name}()")
