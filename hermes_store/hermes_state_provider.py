"""Hermes v30's ``hermes_state_provider``: the same module object as :mod:`hermes_store.state_modules.provider`.

Absolute import on purpose: a Hermes child process may import this file by its bare
name (the package folder first on ``sys.path``), where a relative import has no package.
"""

import sys

from hermes_store.state_modules import provider as _module

sys.modules[__name__] = _module
