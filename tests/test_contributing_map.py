"""CONTRIBUTING.md's layer map says what tests/test_layout.py enforces (issue 31, point 6)."""

from __future__ import annotations

import re

from .helpers import REPO
from .test_layout import LAYERS


def _map_rows() -> dict[str, str]:
    """Layer name -> the rest of its row, from the map table in CONTRIBUTING.md."""
    text = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    start = text.index("## The map")
    rows: dict[str, str] = {}
    for line in text[start:].splitlines()[1:]:
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("layer", "---"):
            rows[cells[0]] = cells[1]
    return rows


def _named(member: str, row: str) -> bool:
    """``member`` (dotted, from hermes_store) is named in ``row``: as itself, as a folder,
    by its last part inside its folder's listing, or by a ``prefix*`` pattern."""
    last = member.rsplit(".", 1)[-1]
    names = set(re.findall(r"`([^`]+)`", row)) | set(re.findall(r"\b([a-z_]+)\b", row))
    stems = {n[:-1] for n in names if n.endswith("*")}
    return (member in names or f"{member}/" in names or last in names
            or any(member.startswith(s) for s in stems))


def test_the_map_has_every_layer_in_order() -> None:
    assert list(_map_rows()) == [name for name, _why, _members in LAYERS]


def test_the_map_names_every_module_of_each_layer() -> None:
    rows = _map_rows()
    missing = [f"{name}: {member}" for name, _why, members in LAYERS for member in members
               if member and not _named(member, rows.get(name, ""))]
    assert missing == []


def test_the_check_sees_a_module_left_out() -> None:
    assert _named("search", "`search/`") and _named("hermes_state_common", "`hermes_state*`")
    assert _named("aio.queues", "the async twins in `aio/` (engine, queues)")
    assert not _named("upkeep", "`uow`, `operations/`")
