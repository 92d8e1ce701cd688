"""The strategy interface (how replicas agree) and the registry of strategies by name.

A strategy sees the training step at fixed points: after ``setup`` the replicas
must hold the same parameters; ``after_backward`` runs once gradients exist
(data-parallel strategies average them here, or overlap that with backward
through hooks installed in ``setup``); ``after_step`` follows the optimizer
step (local SGD averages parameters here). Algorithm state lives in the
strategy and is saved through ``state_dict``; process groups never are.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from disttrain.comm.world import World
from disttrain.config import RunConfig

__all__ = ["STRATEGIES", "Strategy", "get", "register"]


class Strategy:
    """How data-parallel replicas (or model shards) agree; override only the hooks you need."""

    name: ClassVar[str]

    def __init__(self, config: RunConfig) -> None:
        self.config = config

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, world: World) -> None:
        """Make the replicas consistent before the first step."""
        self.model = model
        self.optimizer = optimizer
        self.world = world

    def after_backward(self) -> None:
        """Gradients are ready: make them what the optimizer should apply."""

    def after_step(self, step: int) -> None:
        """The optimizer has stepped (``step`` counts from 1)."""

    def summary(self) -> dict[str, Any]:
        """Strategy-specific figures for summary.json."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


STRATEGIES: dict[str, type[Strategy]] = {}


def register(cls: type[Strategy]) -> type[Strategy]:
    """Class decorator: make a strategy available as ``--strategy NAME``."""
    STRATEGIES[cls.name] = cls
    return cls


def get(name: str) -> type[Strategy]:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(
            f"unknown strategy {name!r}; choose one of {', '.join(sorted(STRATEGIES))}"
        ) from None
