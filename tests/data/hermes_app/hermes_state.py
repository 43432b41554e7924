import sys, hermes_store.hermes_state as m; sys.modules[__name__] = m  # noqa: E401,E702 - the one-line swap
