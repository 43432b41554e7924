import sys, hermes_store.hermes_state_provider as m; sys.modules[__name__] = m
