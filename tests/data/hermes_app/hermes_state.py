import sys, hermes_store.hermes_state as m; sys.modules[__name__] = m
