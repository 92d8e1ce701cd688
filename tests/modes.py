"""Every registered strategy's modes as a script passes them to ``dt.distribute``: from
each strategy's own declaration (``StrategySettings.modes``: command-line words), so the
per-strategy test lists grow with the registry."""

from __future__ import annotations

import json
from typing import Any

from disttrain.registry import load_plugins
from disttrain.strategies import STRATEGIES

__all__ = ["first_modes", "keywords", "modes"]


def _value(word: str) -> Any:
    """A command-line word as the Python value a script passes (``"2"`` -> 2)."""
    try:
        return json.loads(word)
    except ValueError:
        return word


def keywords(words: tuple[str, ...]) -> dict[str, Any]:
    """``("--ps-mode", "async")`` -> ``{"ps_mode": "async"}``."""
    pairs = zip(words[::2], words[1::2], strict=True)
    return {w[2:].replace("-", "_"): _value(v) for w, v in pairs}


def modes() -> list[tuple[str, dict[str, Any]]]:
    """(label, keywords with ``strategy``) of every mode of every strategy."""
    load_plugins()
    return [
        (f"{name}:{mode}" if mode else name, {"strategy": name, **keywords(words)})
        for name, kind in STRATEGIES.items()
        for mode, words in kind.settings.modes.items()
    ]


def first_modes() -> dict[str, tuple[str, ...]]:
    """Each strategy's first mode, as command-line words."""
    load_plugins()
    return {name: next(iter(k.settings.modes.values())) for name, k in STRATEGIES.items()}
