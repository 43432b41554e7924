"""Issue 31, point 3: one retry runner, one repository registry, one clock handed down.

The retry runner is driven with a virtual clock (no real waits); the registry is checked
against what the units of work and the aio module expose; the clock a unit of work is
given is the one its rows are stamped with."""

from __future__ import annotations

import sqlite3
import typing
from pathlib import Path

import pytest

from hermes_store import errors, migrations, retry
from hermes_store.aio import repositories as arepos
from hermes_store.aio.uow import AsyncUnitOfWork
from hermes_store.engine import create_engine
from hermes_store.repositories import REPOSITORIES, UNIT_OF_WORK, ApiCallUsage, SessionRepository, UsageRepository
from hermes_store.repositories.base import clock_options
from hermes_store.uow import UnitOfWork


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _locked() -> sqlite3.OperationalError:
    return sqlite3.OperationalError("database is locked")


def test_a_held_lock_is_waited_out_then_given_up_typed_and_chained() -> None:
    clock = VirtualClock()
    tries: list[float] = []

    def attempt(deadline: float) -> None:
        tries.append(deadline)
        raise _locked()

    with pytest.raises(errors.DatabaseLockedError, match="here: database stayed locked for 1s") as info:
        retry.run(attempt, budget=1.0, triage=retry.locks(lambda exc: "locked" in str(exc)),
                  give_up=retry.locked_error("here", 1.0), sleep=clock.sleep, monotonic=clock.monotonic)
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    assert sum(clock.sleeps) == pytest.approx(1.0) and len(tries) == len(clock.sleeps) + 1
    assert set(tries) == {1.0}  # every try sees the same deadline


def test_a_lock_already_typed_is_chained_from_the_driver_error() -> None:
    clock = VirtualClock()
    driver = _locked()
    typed = errors.DatabaseLockedError("typed by the engine")
    typed.__cause__ = driver

    def attempt(_deadline: float) -> None:
        raise typed

    with pytest.raises(errors.DatabaseLockedError, match="giving up") as info:
        retry.run(attempt, budget=0.1, triage=retry.locks(lambda exc: True), give_up=retry.locked_error("x", 0.1),
                  sleep=clock.sleep, monotonic=clock.monotonic)
    assert info.value.__cause__ is driver


def test_again_retries_at_once_and_raise_propagates() -> None:
    clock = VirtualClock()
    outcomes: list[BaseException | None] = [ValueError("stale"), ValueError("stale"), None]

    def attempt(_deadline: float) -> str:
        exc = outcomes.pop(0)
        if exc is not None:
            raise exc
        return "done"

    assert retry.run(attempt, budget=1.0, triage=lambda exc: retry.AGAIN, give_up=retry.locked_error("x", 1.0),
                     sleep=clock.sleep, monotonic=clock.monotonic) == "done"
    assert clock.sleeps == []

    def broken(_deadline: float) -> None:
        raise KeyError("no")

    with pytest.raises(KeyError):
        retry.run(broken, budget=1.0, triage=retry.locks(lambda exc: True), give_up=retry.locked_error("x", 1.0),
                  sleep=clock.sleep, monotonic=clock.monotonic)
    assert clock.sleeps == []  # not a driver error: no wait


def test_busy_waits_within_its_own_limit_then_raises_the_error_itself() -> None:
    clock = VirtualClock()
    dropped: list[BaseException] = []

    def attempt(_deadline: float) -> None:
        raise errors.SessionCompressionInProgressError("s1")

    with pytest.raises(errors.SessionCompressionInProgressError):
        retry.run(attempt, budget=20.0, triage=lambda exc: retry.Busy(0.5), give_up=retry.locked_error("x", 20.0),
                  sleep=clock.sleep, monotonic=clock.monotonic, before_wait=dropped.append)
    assert sum(clock.sleeps) == pytest.approx(0.5) and len(dropped) == len(clock.sleeps)


def test_jitter_switches_windows_after_the_early_phase_and_never_passes_the_budget(monkeypatch) -> None:
    monkeypatch.setattr(retry.random, "uniform", lambda low, high: high)
    assert retry.jitter(0.0, 10.0, early=(0.1, 0.2), late=(0.5, 0.9), phase=1.0) == 0.2
    assert retry.jitter(1.5, 10.0, early=(0.1, 0.2), late=(0.5, 0.9), phase=1.0) == 0.9
    assert retry.jitter(1.5, 0.3, early=(0.1, 0.2), late=(0.5, 0.9), phase=1.0) == 0.3


def test_the_units_of_work_offer_the_registry() -> None:
    hints = typing.get_type_hints(UnitOfWork)
    assert {name: hints[name] for name in UNIT_OF_WORK} == dict(UNIT_OF_WORK)  # what a type checker sees
    assert set(typing.get_type_hints(AsyncUnitOfWork)) >= set(UNIT_OF_WORK)
    for sync in REPOSITORIES:
        face = getattr(arepos, sync.__name__)
        assert face.sync_class is sync and sync.__name__ in arepos.__all__


def test_a_unit_of_work_stamps_rows_by_its_clock(tmp_path: Path) -> None:
    engine = create_engine(tmp_path / "s.db")
    try:
        migrations.upgrade(engine)
        with UnitOfWork(engine, clock=lambda: 1234.5) as uow:
            uow.sessions.create("s1", "cli")
            uow.usage.update_token_counts("s2", ApiCallUsage(input_tokens=1))  # creates s2 through a peer repository
        with engine.connect() as conn:
            assert SessionRepository(conn).get("s1")["started_at"] == 1234.5
            assert SessionRepository(conn).get("s2")["started_at"] == 1234.5
            # A repository's own clock wins over its connection's, and reaches its peers.
            conn.execution_options(**clock_options(lambda: 1.0))
            UsageRepository(conn, clock=lambda: 99.0).update_token_counts("s3", ApiCallUsage(input_tokens=1))
            assert SessionRepository(conn).get("s3")["started_at"] == 99.0
            assert SessionRepository(conn).now() == 1.0
            conn.rollback()
    finally:
        engine.dispose()
