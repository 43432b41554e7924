"""UsageRepository.update_token_counts takes one ApiCallUsage; SessionDB keeps Hermes'
flat signature and builds it. Both write the same rows, and the object is strict and
immutable."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
from sqlalchemy import Engine, select

from hermes_store import SessionDB, UnitOfWork, errors
from hermes_store.models import Base
from hermes_store.repositories import ApiCallUsage, UsageRepository

#: Stamped with the wall clock, so they differ between two runs of the same calls.
TIMES = frozenset({"started_at", "ended_at", "last_activity_at", "last_read_at", "first_seen", "last_seen"})

#: (session, the call's figures, absolute): every rule of the method gets a turn.
CALLS: list[tuple[str, dict[str, Any], bool]] = [
    # no usage: the model is filled by the create upsert, the route is not
    ("s", {"model": "m", "billing_provider": "p", "billing_base_url": "u", "billing_mode": "chat"}, False),
    # the first accounted call, every counter and cost field
    ("s", {"input_tokens": 10, "output_tokens": 5, "cache_read_tokens": 3, "cache_write_tokens": 2,
           "reasoning_tokens": 1, "model": "m", "billing_provider": "p", "estimated_cost_usd": 0.25,
           "actual_cost_usd": 0.1, "cost_status": "estimated", "cost_source": "table", "pricing_version": "v1",
           "api_call_count": 1}, False),
    # a later route does not replace the sticky one, but keys its own ledger row
    ("s", {"input_tokens": 4, "model": "fallback", "billing_provider": "q", "api_call_count": 1}, False),
    # a side task: ledger only
    ("s", {"input_tokens": 7, "model": "vision-model", "billing_mode": "chat", "api_call_count": 2,
           "estimated_cost_usd": 0.5, "task": "vision"}, False),
    # an actual cost alone moves the session, not the ledger
    ("s", {"actual_cost_usd": 1.5}, False),
    # a resync creates the row and sets the totals; then a delta on top
    ("t", {"input_tokens": 100, "output_tokens": 50, "estimated_cost_usd": 3.0}, True),
    ("t", {"input_tokens": 1, "output_tokens": 1}, False),
]


def rows(engine: Engine) -> dict[str, list[dict[str, Any]]]:
    """Sessions and ledger as stored, in key order, without the clock columns."""
    out = {}
    for name in ("sessions", "session_model_usage"):
        t = Base.metadata.tables[name]
        with engine.connect() as conn:
            found = conn.execute(select(t).order_by(*t.primary_key.columns)).mappings().all()
        out[name] = [{k: v for k, v in r.items() if k not in TIMES} for r in found]
    return out


def test_the_object_writes_what_the_flat_call_writes(db: SessionDB, engine: Engine) -> None:
    for sid, figures, absolute in CALLS:
        db.update_token_counts(sid, **figures, absolute=absolute)
        with UnitOfWork(engine) as uow:
            uow.usage.update_token_counts(sid, ApiCallUsage(**figures), absolute=absolute)
    flat, grouped = rows(db.engine), rows(engine)
    assert grouped == flat
    # Not two empty or half-written stores that happen to agree: the calls landed.
    by_id = {r["id"]: r for r in grouped["sessions"]}
    assert (by_id["s"]["input_tokens"], by_id["s"]["model"], by_id["s"]["billing_provider"]) == (14, "m", "p")
    assert by_id["s"]["actual_cost_usd"] == pytest.approx(1.6)
    assert (by_id["t"]["input_tokens"], by_id["t"]["output_tokens"]) == (101, 51)
    assert [(r["session_id"], r["model"], r["task"], r["input_tokens"]) for r in grouped["session_model_usage"]] == [
        ("s", "fallback", "", 4), ("s", "m", "", 10), ("s", "vision-model", "vision", 7), ("t", "unknown", "", 1),
    ]


def test_the_object_has_the_flat_signatures_fields_and_defaults() -> None:
    flat = {
        name: p.default for name, p in inspect.signature(SessionDB.update_token_counts).parameters.items()
        if name not in ("self", "session_id", "absolute")
    }
    fields = {f.name: f.default for f in dataclasses.fields(ApiCallUsage)}
    assert fields == flat
    assert all(f.kw_only for f in dataclasses.fields(ApiCallUsage))


def test_positional_or_unknown_fields_are_refused() -> None:
    with pytest.raises(TypeError):
        ApiCallUsage(10, 5)  # type: ignore[misc]
    with pytest.raises(TypeError):
        ApiCallUsage(input_tokenz=10)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        ApiCallUsage(absolute=True)  # type: ignore[call-arg]  # how to apply, not what was used


def test_the_repository_refuses_the_flat_form(engine: Engine) -> None:
    with UnitOfWork(engine) as uow:
        with pytest.raises(errors.InvalidInputError, match="ApiCallUsage"):
            uow.usage.update_token_counts("s", 10)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            UsageRepository(uow.conn).update_token_counts("s", ApiCallUsage(), True)  # type: ignore[misc]
        with pytest.raises(errors.InvalidInputError, match="input_tokens"):
            uow.usage.update_token_counts("s", ApiCallUsage(input_tokens="many"))  # type: ignore[arg-type]
        with pytest.raises(errors.InvalidInputError, match="absolute"):
            uow.usage.update_token_counts("s", ApiCallUsage(input_tokens=1, task="vision"), absolute=True)
    assert rows(engine) == {"sessions": [], "session_model_usage": []}


def test_the_object_is_immutable() -> None:
    usage = ApiCallUsage(input_tokens=3, model="m")
    with pytest.raises(dataclasses.FrozenInstanceError):
        usage.input_tokens = 4  # type: ignore[misc]
    with pytest.raises((dataclasses.FrozenInstanceError, AttributeError, TypeError)):
        usage.extra = 1  # type: ignore[attr-defined]
    assert not hasattr(usage, "__dict__")
    changed = dataclasses.replace(usage, input_tokens=4)
    assert (usage.input_tokens, changed.input_tokens, changed.model) == (3, 4, "m")
    assert hash(usage) == hash(ApiCallUsage(input_tokens=3, model="m"))
