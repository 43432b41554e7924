"""Hermes' ``hermes_state_common``: the same module object as :mod:`hermes_store.state_modules.common`.

Absolute import on purpose: a Hermes child process may import this file by its bare
name (the package folder first on ``sys.path``), where a relative import has no package.
"""

import sys

from hermes_store.state_modules import common as _module

sys.modules[__name__] = _module
