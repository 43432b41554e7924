"""Names read on the ``hermes_state`` module when they are used, not when imported.

After the swap ``hermes_state`` *is* ``hermes_store.facade``, and Hermes' code and tests
patch its globals (``time``, ``psutil``, ``sqlite3``, the patience and cap values, the
backup helper...). The modules below the facade cannot import it (it imports them), so
they look such a name up here, with their own value as the fallback until the facade
is loaded.
"""

from __future__ import annotations

import sys
from typing import Any

FACADE_MODULE = "hermes_store.facade"


def facade_value(name: str, default: Any) -> Any:
    """``hermes_state.<name>`` as it is now, else ``default``."""
    return getattr(sys.modules.get(FACADE_MODULE), name, default)
