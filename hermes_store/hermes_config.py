"""Hermes' ``config.yaml``, read the way Hermes' state module reads it.

Hermes v26 takes a few database settings from ``$HERMES_HOME/config.yaml``
(``database.journal_mode``, ``database.cache_size``, ``sessions.max_resume_messages``
...). Each read is fresh (the file may change between opens) and never raises: a
missing, unreadable or malformed file reads as empty, as Hermes' loader does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml


def hermes_home() -> Path:
    """``$HERMES_HOME``, else ``~/.hermes``, evaluated now."""
    home = os.environ.get("HERMES_HOME")
    return Path(home).expanduser() if home else Path(os.path.expanduser("~")) / ".hermes"


def load_config() -> dict[str, Any]:
    """The parsed ``config.yaml`` as a dict; ``{}`` when absent, unreadable or not a mapping."""
    try:
        text = (hermes_home() / "config.yaml").read_text(encoding="utf-8")
        data = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def config_section(name: str) -> dict[str, Any] | None:
    """One top-level section, or None when it is missing or not a mapping."""
    section = load_config().get(name)
    return section if isinstance(section, dict) else None
