"""hermes_store: the session-state layer of an AI agent, on SQLAlchemy 2.0 + Alembic.

Nothing is created or connected at import time.
"""

from .errors import HermesStoreError

__version__ = "0.1.0"

__all__ = ["HermesStoreError", "__version__"]
