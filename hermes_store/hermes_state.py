"""The stand-in for Hermes' ``hermes_state`` module: this name *is* ``hermes_store.facade``.

Hermes' code and tests patch names on the module they imported
(``hermes_state.DEFAULT_DB_PATH``, ``hermes_state.time``,
``hermes_state.sqlite3.connect``). A copy of our names would take those patches
without SessionDB ever seeing them, so the swap hands out the very module SessionDB
reads from. The one-line swap, as a ``hermes_state.py`` where Hermes' code imports it::

    import sys, hermes_store.hermes_state as m; sys.modules[__name__] = m

or call :func:`install` before Hermes' code runs.
"""

import importlib
import sys

from hermes_store import facade as _facade
from hermes_store.state_modules import BARE_NAMES


def install() -> None:
    """Make ``import hermes_state`` return our facade module, and ``import hermes_state_common``
    (``_schema``, ``_search``, ``_portability``) our companion modules (idempotent)."""
    sys.modules["hermes_state"] = _facade
    _register_companions()


def _register_companions() -> None:
    for bare, ours in BARE_NAMES.items():
        sys.modules[bare] = importlib.import_module(f"hermes_store.state_modules.{ours}")


_facade.install = install
sys.modules[__name__] = _facade
# Imported by its bare name (Hermes' child processes put this folder on sys.path):
# the companions are served the same way, whichever is imported next.
if __name__ == "hermes_state":
    _register_companions()
