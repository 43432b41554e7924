import hermes_store.hermes_state as m; m.install()
