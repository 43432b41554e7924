"""The compatibility suite: Hermes v23's SessionDB contract, exercised as Hermes' code would.

Everything goes through ``import hermes_state`` after the one-line swap, so a test
here proves the swapped module, not just our package. A module runs on both
backends with ``pytestmark = pytest.mark.both_backends`` (the v23 methods are
portable); tests about the SQLite file itself take ``sqlite_db`` or are marked
``sqlite_only``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from collections.abc import Iterator

import pytest

from .helpers import FakeTime


@pytest.fixture
def hermes_state():
    """The ``hermes_state`` module after the swap (our facade module object)."""
    import hermes_store.hermes_state as ours

    previous = sys.modules.get("hermes_state")
    ours.install()
    import hermes_state

    assert hermes_state is ours
    try:
        yield hermes_state
    finally:
        if previous is None:
            sys.modules.pop("hermes_state", None)
        else:
            sys.modules["hermes_state"] = previous


@pytest.fixture
def db(hermes_state, tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> Iterator:
    """``hermes_state.SessionDB`` on a fresh SQLite file, or a fresh PostgreSQL database."""
    if backend == "postgresql":
        store = hermes_state.SessionDB(request.getfixturevalue("pg_database"))
    else:
        store = hermes_state.SessionDB(tmp_path / "state.db")
    yield store
    store.close()


@pytest.fixture
def clock(hermes_state, monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    """``hermes_state.time`` replaced by a settable clock (modules may define their own)."""
    fake = FakeTime(1_700_000_000.0)
    monkeypatch.setattr(hermes_state, "time", fake)
    return fake
