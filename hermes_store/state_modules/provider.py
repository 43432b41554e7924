"""Hermes v30's ``hermes_state_provider``: the session-storage provider contract.

Hermes v30 picks its session store by ``sessiondb.provider`` in ``config.yaml``
(default ``sqlite``) through :func:`get_session_db_provider`, and its own ``SessionDB``
satisfies :class:`SessionDBProvider` through a mixin placed before the ABC. Ours does
the same (``hermes_state.SessionDB`` is a :class:`SessionDBProvider`), and the factory
also answers ``postgresql``, so a Hermes user reaches a server through Hermes' own
switch::

    sessiondb:
      provider: postgresql
      postgresql:
        url: postgresql+psycopg://hermes@db.internal/hermes   # or url_env: NAME_OF_A_VARIABLE
        schema: team_a                                          # optional tenant schema

Nothing here imports ``hermes_state`` at import time (the facade imports this module);
``SessionDB`` is looked up on the facade module when first asked for.
"""

from __future__ import annotations

import abc
import importlib
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from ..dialects import backend_name
from ..errors import ProviderConfigError
from ..hermes_config import load_config
from ..patch_points import FACADE_MODULE

log = logging.getLogger("hermes_state")

#: ``sessiondb.provider`` when config.yaml names none (Hermes' default).
DEFAULT_PROVIDER = "sqlite"


class SessionDBProvider(abc.ABC):
    """What a session-storage backend offers Hermes (v30, RFC #23717 phase 1).

    Deliberately narrow and synchronous: lifecycle, session rows, titles, messages,
    search and counts, ``state_meta``, and write hooks. The hooks are concrete: a
    pre-commit hook ``hook(conn)`` runs inside each write transaction after the change
    and before the commit, and an exception from it rolls the write back and reaches
    the caller; a post-write hook ``hook()`` runs after a successful commit only.
    """

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """Short id of the backend (``"sqlite"``…)."""

    @abc.abstractmethod
    def is_available(self) -> bool:
        """Configured and ready to serve."""

    @abc.abstractmethod
    def initialize(self, **kwargs: Any) -> None:
        """One-time startup."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Release every resource."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection(s)."""

    @abc.abstractmethod
    def create_session(self, session_id: str, source: str, **kwargs: Any) -> str: ...

    @abc.abstractmethod
    def ensure_session(self, session_id: str, source: str = "unknown", model: Optional[str] = None,
                       **kwargs: Any) -> str: ...

    @abc.abstractmethod
    def get_session(self, session_id: str) -> Optional[dict[str, Any]]: ...

    @abc.abstractmethod
    def end_session(self, session_id: str, end_reason: str) -> None: ...

    @abc.abstractmethod
    def reopen_session(self, session_id: str) -> None: ...

    @abc.abstractmethod
    def delete_session(self, session_id: str, **kwargs: Any) -> Any: ...

    @abc.abstractmethod
    def update_session_meta(self, session_id: str, model_config_json: str, model: Optional[str] = None) -> None: ...

    @abc.abstractmethod
    def set_session_title(self, session_id: str, title: str) -> bool: ...

    @abc.abstractmethod
    def get_session_title(self, session_id: str) -> Optional[str]: ...

    @abc.abstractmethod
    def append_message(self, session_id: str, role: str, content: Optional[str] = None, **kwargs: Any) -> int: ...

    @abc.abstractmethod
    def append_messages_batch(self, session_id: str, messages: list[dict[str, Any]], **kwargs: Any) -> int: ...

    @abc.abstractmethod
    def replace_messages(self, session_id: str, messages: list[dict[str, Any]], active_only: bool = False,
                         **kwargs: Any) -> None: ...

    @abc.abstractmethod
    def get_messages(self, session_id: str, include_inactive: bool = False, limit: Optional[int] = None,
                     offset: int = 0, **kwargs: Any) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def get_messages_as_conversation(self, session_id: str, include_ancestors: bool = False,
                                     include_inactive: bool = False, **kwargs: Any) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def search_messages(self, query: str, source_filter: Optional[list[str]] = None,
                        exclude_sources: Optional[list[str]] = None, role_filter: Optional[list[str]] = None,
                        limit: int = 20, offset: int = 0, **kwargs: Any) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def search_sessions(self, source: Optional[str] = None, limit: int = 20, offset: int = 0,
                        **kwargs: Any) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def list_sessions_rich(self, source: Optional[str] = None, limit: int = 20, offset: int = 0,
                           **kwargs: Any) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def session_count(self, source: Optional[str] = None, **kwargs: Any) -> int: ...

    @abc.abstractmethod
    def message_count(self, session_id: Optional[str] = None) -> int: ...

    @abc.abstractmethod
    def get_meta(self, key: str) -> Optional[str]: ...

    @abc.abstractmethod
    def set_meta(self, key: str, value: str, **kwargs: Any) -> None: ...

    # ---------------------------------------------------------------- write hooks (concrete)

    def add_pre_commit_hook(self, hook: Callable[[Any], Any]) -> None:
        """Run ``hook(conn)`` inside every write transaction, before its commit; raising vetoes the write."""
        hooks = self.__dict__.setdefault("_pre_commit_hooks", [])
        hooks.append(hook)

    def add_post_write_hook(self, hook: Callable[[], Any]) -> None:
        """Run ``hook()`` after every committed write (never after a rolled-back one)."""
        hooks = self.__dict__.setdefault("_post_write_hooks", [])
        hooks.append(hook)

    def clear_write_hooks(self) -> None:
        """Drop every hook of both kinds."""
        self.__dict__["_pre_commit_hooks"] = []
        self.__dict__["_post_write_hooks"] = []


class SQLiteProviderMixin:
    """The provider members Hermes' SQLite engine adds to ``SessionDB``; ours serve a
    server too, so :attr:`name` is the kind of database the store is on."""

    @property
    def name(self) -> str:
        url = getattr(self, "url", None)
        return backend_name(url) if url is not None else DEFAULT_PROVIDER

    def is_available(self) -> bool:
        """True while the store is open (False once closed, or before it opened)."""
        return getattr(self, "_engine", None) is not None

    def initialize(self, **kwargs: Any) -> None:
        """Nothing to do: the store connects, adopts and migrates in ``__init__``."""

    def shutdown(self) -> None:
        """Hermes' alias of ``close()``."""
        self.close()  # type: ignore[attr-defined]  # SessionDB's


def _facade() -> Any:
    """The ``hermes_state`` module (our facade), imported on first use: it imports this one."""
    module = sys.modules.get(FACADE_MODULE)
    return module if module is not None else importlib.import_module(FACADE_MODULE)


def __getattr__(name: str) -> Any:
    """``SQLiteSessionProvider``: the facade's ``SessionDB`` class, resolved lazily (as Hermes')."""
    if name == "SQLiteSessionProvider":
        return _facade().SessionDB
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _section(config: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The ``sessiondb`` section of ``config`` (a whole config.yaml dict, or that section
    itself), or of ``$HERMES_HOME/config.yaml`` when ``config`` is None."""
    if config is None:
        config = load_config()
    if not isinstance(config, dict):
        raise ProviderConfigError(f"config must be a mapping (config.yaml's contents), not {type(config).__name__}")
    section = config.get("sessiondb", config if "provider" in config else {})
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise ProviderConfigError("config.yaml: sessiondb must be a mapping (sessiondb: {provider: ...})")
    return section


def server_url(section: dict[str, Any]) -> tuple[str, Optional[str]]:
    """(URL, schema) of ``sessiondb.postgresql``: ``url``, or the variable ``url_env`` names."""
    pg = section.get("postgresql") or {}
    if not isinstance(pg, dict):
        raise ProviderConfigError("config.yaml: sessiondb.postgresql must be a mapping with url (or url_env)")
    url = pg.get("url")
    env = pg.get("url_env")
    if not url and env:
        url = os.environ.get(str(env))
        if not url:
            raise ProviderConfigError(f"config.yaml: sessiondb.postgresql.url_env names ${env}, which is not set")
    if not url or not isinstance(url, str):
        raise ProviderConfigError(
            "config.yaml: sessiondb.provider is postgresql but sessiondb.postgresql.url (or url_env) is missing"
        )
    schema = pg.get("schema")
    if schema is not None and not isinstance(schema, str):
        raise ProviderConfigError("config.yaml: sessiondb.postgresql.schema must be a string")
    return url, schema


def get_session_db_provider(db_path: Optional[str | os.PathLike[str]] = None, read_only: bool = False,
                            config: Optional[dict[str, Any]] = None) -> SessionDBProvider:
    """The configured provider, opened: our ``SessionDB`` on Hermes' file for ``sqlite``
    (``db_path``, else Hermes' default file), on a server for ``postgresql`` (its URL
    from config.yaml; ``db_path`` is not used). Any other name raises ValueError, as
    Hermes' factory does: never a silent fallback to another store."""
    section = _section(config)
    raw = section.get("provider") or DEFAULT_PROVIDER
    opener = _OPENERS.get(str(raw).strip().lower())
    if opener is None:
        raise ProviderConfigError(
            f"sessiondb provider {raw!r} is not available in this build; hermes_store ships "
            f"{', '.join(repr(p) for p in _OPENERS)}"
        )
    return opener(db_path, read_only, section)


def _open_file(db_path: Optional[str | os.PathLike[str]], read_only: bool, _section: dict[str, Any]) -> Any:
    """``sqlite``: Hermes' file (``db_path``, else its default path: never ``$HERMES_STORE_URL``)."""
    facade = _facade()
    path = Path(db_path) if db_path is not None else facade._default_db_path()
    return facade.SessionDB(path, read_only=read_only)


def _open_server(_db_path: Any, read_only: bool, section: dict[str, Any]) -> Any:
    """``postgresql``: the server and tenant schema config.yaml names."""
    url, schema = server_url(section)
    return _facade().SessionDB(url=url, read_only=read_only, schema=schema)


_OPENERS: dict[str, Callable[[Any, bool, dict[str, Any]], Any]] = {
    "sqlite": _open_file,
    "postgresql": _open_server,
    "postgres": _open_server,
}


__all__ = ["SQLiteProviderMixin", "SessionDBProvider", "get_session_db_provider"]
