"""``--optimizer`` by name: a registry of factories building a torch optimizer from the settings.

    OPTIMIZERS.get("adam")(params, train_config)   # unknown name: the usage error with choices

A new optimizer is one ``@OPTIMIZERS.register("name")`` function here (and its
name in :class:`~disttrain.config.TrainConfig`'s ``optimizer`` choices, which
the command line checks before anything is built).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from disttrain.config import TrainConfig
from disttrain.registry import Registry

__all__ = ["OPTIMIZERS", "make_optimizer"]

OptimizerFactory = Callable[[Any, TrainConfig], torch.optim.Optimizer]

OPTIMIZERS = Registry[OptimizerFactory]("optimizer", flag="--optimizer")


@OPTIMIZERS.register("sgd")
def _sgd(params: Any, tc: TrainConfig) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=tc.lr, weight_decay=tc.weight_decay)


@OPTIMIZERS.register("momentum")
def _momentum(params: Any, tc: TrainConfig) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=tc.lr, momentum=tc.momentum, weight_decay=tc.weight_decay)


@OPTIMIZERS.register("adam")
def _adam(params: Any, tc: TrainConfig) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=tc.lr, weight_decay=tc.weight_decay)


def make_optimizer(params: Any, tc: TrainConfig) -> torch.optim.Optimizer:
    """The ``--optimizer`` of ``tc`` over ``params``, with its learning rate and decay."""
    return OPTIMIZERS.get(tc.optimizer)(params, tc)
