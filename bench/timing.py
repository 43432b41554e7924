"""The plan of one interleaved measurement, shared by the sync and the async benchmarks.

``run.bench`` (plain calls) and ``aio_bench.abench`` (awaited calls) measure the same
way: a warm-up, as many timed repetitions per implementation as its warm-up time allows,
then the implementations interleaved round-robin with a rotating start, so that drift
(caches, the load of the machine, background upkeep) falls on all of them alike.
:class:`Schedule` holds that plan and its bookkeeping; each driver only makes, and times,
the calls, so that sync and async figures cannot drift apart by a copy edited on one side.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import subprocess
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

import meter

#: A call to measure: plain (run.py) or returning an awaitable (aio_bench.py).
Fn = Callable[[], Any]


class Schedule:
    """Which implementation is called when, and the samples the driver records.

    ``impls``: name -> the call to measure. The driver makes each call of :meth:`warm_ups`
    and reports it with :meth:`warmed`, then times each call of :meth:`timed`, appending
    the nanoseconds to ``samples[name]``. An implementation whose (last) warm-up call took
    more than ``slow_s`` is pathological: that call is its only sample. With ``budget_s``,
    an implementation gets only as many repetitions as fit in about that time (never
    fewer than ``min_reps``). The value of each implementation's first call is stored in
    ``results`` (for correctness checks).
    """

    def __init__(self, impls: dict[str, Fn], *, reps: int, warmup: int = 1, budget_s: float | None = None,
                 min_reps: int = 5, slow_s: float = 5.0, results: dict[str, Any] | None = None) -> None:
        self.impls = impls
        self.names = list(impls)
        self.reps = reps
        self.warmup = max(warmup, 1)
        self.budget_s = budget_s
        self.min_reps = min_reps
        self.slow_s = slow_s
        self.results = results
        self.first: dict[str, float] = {}  # seconds of each implementation's last warm-up call
        self.samples: dict[str, list[int]] = {n: [] for n in self.names}
        self._warm_calls: dict[str, int] = {}

    def warm_ups(self) -> Iterator[tuple[str, Fn]]:
        """The warm-up calls (name, fn): ``warmup`` of each implementation in turn."""
        for name in self.names:
            for _ in range(self.warmup):
                yield name, self.impls[name]

    def warmed(self, name: str, ns: int, value: Any) -> None:
        """A warm-up call of ``name`` took ``ns`` and returned ``value``."""
        self.first[name] = ns / 1e9
        calls = self._warm_calls[name] = self._warm_calls.get(name, 0) + 1
        if calls == 1 and self.results is not None:
            self.results[name] = value

    def _wanted(self) -> dict[str, int]:
        """Timed repetitions per implementation, from the warm-up times."""
        want: dict[str, int] = {}
        for name in self.names:
            first = self.first[name]
            if first > self.slow_s:
                self.samples[name].append(int(first * 1e9))
                want[name] = 0
            elif self.budget_s is not None:
                want[name] = max(self.min_reps, min(self.reps, int(self.budget_s / max(first, 1e-9))))
            else:
                want[name] = self.reps
        return want

    def timed(self) -> Iterator[tuple[str, Fn]]:
        """The timed calls in order: round-robin, each round starting one implementation later,
        an implementation left out once it has had its repetitions."""
        want = self._wanted()
        names = self.names
        gc.collect()  # not during the timed calls
        r = 0
        while any(want[n] > 0 for n in names):
            order = names[r % len(names):] + names[:r % len(names)]
            r += 1
            for name in order:
                if want[name] <= 0:
                    continue
                want[name] -= 1
                yield name, self.impls[name]

    def probe_calls(self, name: str) -> int:
        """How many extra calls :func:`meter.probe` (or its awaited twin) gives ``name``."""
        return meter.calls_for(statistics.fmean(self.samples[name]) / 1e9)


def commit_of(root: Path) -> str:
    """The checkout's short commit, marked when the library has uncommitted changes
    (a figure is only worth the code it was measured on)."""
    commit = "unknown"
    with contextlib.suppress(Exception):
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "hermes_store"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        commit += " (+ uncommitted hermes_store changes)" if dirty else ""
    return commit


def cpu_model() -> str:
    """The CPU's model name as Linux reports it ("unknown" elsewhere)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"
