"""``hermes_store/aio/surface.py`` (AsyncSessionDB's typed coroutines) is generated from
``SessionDB``: it must be what the generator writes today, or a new sync method would be
missing from the async API (or typed as it no longer is)."""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from hermes_store import aio
from hermes_store.aio import surface
from hermes_store.facade import SessionDB

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "generate_aio_surface.py"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_aio_surface", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_surface_module_is_what_the_generator_writes() -> None:
    text = Path(surface.__file__).read_text(encoding="utf-8")
    assert text == _generator().render(), "stale: run python scripts/generate_aio_surface.py"


def test_the_generator_sees_a_new_method_and_its_kind() -> None:
    """What the staleness check rests on: a method added to SessionDB changes the text."""

    class Grown(SessionDB):
        def brand_new(self, n: int) -> int:
            return n

        def brand_new_rows(self) -> Iterator[int]:
            yield 1

        @staticmethod
        def brand_new_static(n: int) -> int:
            return n

    text = _generator().render(Grown)
    assert "    brand_new = awaited(SYNC.brand_new)\n" in text
    assert "    brand_new_rows = awaited_list(SYNC.brand_new_rows)\n" in text
    assert "    brand_new_static = awaited(SYNC.brand_new_static)\n" in text
    assert text != _generator().render()


def test_check_mode_agrees() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_public_sessiondb_method_is_typed_awaited_with_its_signature() -> None:
    public = {n for n, f in inspect.getmembers(SessionDB, inspect.isfunction) if not n.startswith("_")}
    assert public == {n for n in vars(surface.SessionDBAwaited) if not n.startswith("_")}
    for name in public - set(vars(aio.AsyncSessionDB)):
        method = getattr(aio.AsyncSessionDB, name)
        assert inspect.iscoroutinefunction(method), name
        assert inspect.signature(method) == inspect.signature(getattr(SessionDB, name)), name
        assert method.__doc__ == getattr(SessionDB, name).__doc__, name
