"""L3: data-parallel strategies, one file each, registered by name.

Every module of this package but the helpers below is a strategy file and is
imported here (:func:`disttrain.registry.import_submodules`): a new strategy is one
new file. Plug-in strategies come from ``$DISTTRAIN_PLUGINS``.
"""

from disttrain.registry import import_submodules
from disttrain.strategies.base import STRATEGIES, Strategy, StrategyKind, get, register

#: Modules of this package that hold no strategy (the interface and its helpers).
HELPERS = ("base", "capabilities", "cost", "layout", "runspec", "settings", "spec", "state")

import_submodules(__name__, skip=HELPERS)

__all__ = ["HELPERS", "STRATEGIES", "Strategy", "StrategyKind", "get", "register"]
