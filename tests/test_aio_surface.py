"""``hermes_store/aio/surface.py`` (AsyncSessionDB's typed coroutines) is generated from
``SessionDB``, and ``hermes_store/aio/repositories/__init__.py`` (the async repositories and
what an AsyncUnitOfWork offers) from the repository registry: each must be what the
generator writes today, or a new sync method or repository would be missing from the async
API (or typed as it no longer is)."""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from hermes_store import aio, repositories
from hermes_store.aio import repositories as arepos
from hermes_store.aio import surface
from hermes_store.aio.repositories.base import AsyncRepository
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


def test_the_repositories_module_is_what_the_generator_writes() -> None:
    text = Path(arepos.__file__).read_text(encoding="utf-8")
    assert text == _generator().render_repositories(), "stale: run python scripts/generate_aio_surface.py"


def test_the_generator_sees_a_new_repository_method_and_a_new_repository() -> None:
    """What the staleness check rests on for the repositories: the registry's classes and methods."""

    class SessionRepository(repositories.SessionRepository):
        def brand_new(self, n: int) -> int:
            return n

        def brand_new_rows(self) -> Iterator[int]:
            yield 1

    grown = (SessionRepository, *repositories.REPOSITORIES[1:])
    # Not the registry's class under that name: the generated module could not import it.
    try:
        _generator().render_repositories(grown)
    except SystemExit as refused:
        assert "SessionRepository is not hermes_store.repositories.SessionRepository" in str(refused)
    else:
        raise AssertionError("a class outside the registry's module was accepted")
    generator = _generator()
    generator.repositories = type("Grown", (), {"SessionRepository": SessionRepository, **{
        cls.__name__: cls for cls in repositories.REPOSITORIES[1:]}})
    text = generator.render_repositories(grown)
    assert "    brand_new = awaited(_SessionRepository.brand_new)\n" in text
    assert "    brand_new_rows = awaited_list(_SessionRepository.brand_new_rows)\n" in text
    fewer = _generator().render_repositories(repositories.REPOSITORIES[:-1])
    assert "class TelegramTopicRepository(" not in fewer and fewer != _generator().render_repositories()
    offered = _generator().render_repositories(unit_of_work={"sessions": repositories.SessionRepository})
    assert "    sessions: SessionRepository\n\n" in offered and "    messages:" not in offered


def test_check_mode_fails_when_a_module_is_stale(tmp_path: Path) -> None:
    """``--check`` compares both modules: a hand edit of the generated repositories is caught."""
    generator = _generator()
    generator.REPOSITORIES_TARGET = tmp_path / "__init__.py"
    generator.REPOSITORIES_TARGET.write_text(generator.render_repositories() + "# edited\n", encoding="utf-8")
    old_argv = sys.argv
    sys.argv = ["generate_aio_surface.py", "--check"]
    try:
        assert generator.main() == 1
        generator.REPOSITORIES_TARGET.write_text(generator.render_repositories(), encoding="utf-8")
        assert generator.main() == 0
    finally:
        sys.argv = old_argv


def test_every_public_repository_method_is_typed_awaited_with_its_signature() -> None:
    assert list(arepos.ASYNC_REPOSITORIES) == [cls.__name__ for cls in repositories.REPOSITORIES]
    for sync in repositories.REPOSITORIES:
        face = arepos.async_of(sync)
        assert face is getattr(aio, sync.__name__) and issubclass(face, AsyncRepository)
        assert face.sync_class is sync
        public = {n for n, f in inspect.getmembers(sync, inspect.isfunction) if not n.startswith("_")}
        assert public == {n for n in vars(face) if not n.startswith("_") and n != "sync_class"}, sync.__name__
        for name in public:
            method = getattr(face, name)
            assert inspect.iscoroutinefunction(method), (sync.__name__, name)
            assert inspect.signature(method) == inspect.signature(getattr(sync, name)), (sync.__name__, name)
            assert method.__doc__ == getattr(sync, name).__doc__, (sync.__name__, name)


def test_an_async_unit_of_work_offers_the_registry_typed() -> None:
    """What a type checker reads off AsyncUnitOfWork: the registry's attributes, each the async face."""
    hints = typing.get_type_hints(aio.AsyncUnitOfWork)
    offered = {name: hints[name] for name in hints if name in repositories.UNIT_OF_WORK}
    assert list(offered) == list(repositories.UNIT_OF_WORK)
    assert offered == {name: arepos.async_of(sync) for name, sync in repositories.UNIT_OF_WORK.items()}


def test_every_public_sessiondb_method_is_typed_awaited_with_its_signature() -> None:
    public = {n for n, f in inspect.getmembers(SessionDB, inspect.isfunction) if not n.startswith("_")}
    assert public == {n for n in vars(surface.SessionDBAwaited) if not n.startswith("_")}
    for name in public - set(vars(aio.AsyncSessionDB)):
        method = getattr(aio.AsyncSessionDB, name)
        assert inspect.iscoroutinefunction(method), name
        assert inspect.signature(method) == inspect.signature(getattr(SessionDB, name)), name
        assert method.__doc__ == getattr(SessionDB, name).__doc__, name
