"""One ``compare`` / ``advise`` spec as data: its label, strategy and settings.

Apart from the grammar (:mod:`disttrain.strategies.spec`) so that the strategy
interface can name it without importing the parser (which looks strategies up).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from disttrain.config import RunConfig

__all__ = ["RunSpec"]


@dataclass(frozen=True)
class RunSpec:
    """One spec: its label (as written), its strategy, its train settings (as given).

    ``assumptions`` holds cost-model-only keys (``advise``); they are never train flags.
    """

    label: str
    strategy: str
    settings: dict[str, Any] = field(default_factory=dict)
    assumptions: dict[str, float] = field(default_factory=dict)

    def flags(self, common: dict[str, Any]) -> dict[str, Any]:
        """The ``disttrain train`` flags of this run: ``common`` overridden by the spec."""
        return {**common, "strategy": self.strategy, **self.settings}

    def config(self) -> RunConfig:
        """Every setting: the defaults overridden by the spec's, validated (UsageError)."""
        from disttrain import config

        return config.load({"strategy": self.strategy, **self.settings})
