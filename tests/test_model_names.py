"""The sessions model no longer shadows ``sqlalchemy.orm.Session``; the old name warns."""

from __future__ import annotations

import warnings

import pytest


def test_agent_session_is_the_sessions_model() -> None:
    from hermes_store import models

    assert models.AgentSession.__tablename__ == "sessions"
    assert "Session" not in models.__all__


def test_old_name_still_works_with_a_deprecation_warning() -> None:
    from hermes_store import models

    with pytest.warns(DeprecationWarning, match="AgentSession"):
        old = models.Session
    assert old is models.AgentSession


def test_host_module_can_import_both_names() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from sqlalchemy.orm import Session

        from hermes_store.models import AgentSession, Message  # noqa: F401

    assert Session.__module__.startswith("sqlalchemy")
