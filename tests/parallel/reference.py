"""Shared by the model-parallel tests: a small model, its batches, and the one-process reference."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from disttrain.config import RunConfig, load
from disttrain.models import mlp
from disttrain.train.trainer import loss_fn

Batches = list[tuple[torch.Tensor, torch.Tensor]]

__all__ = ["STEPS", "TOL", "batches", "config", "model", "reference", "train"]

STEPS = 10
TOL = 1e-5
IN, CLASSES = 12, 5


def model(seed: int = 0) -> nn.Sequential:
    """An 8-layer narrow MLP: Flatten, 3 x (Linear, ReLU), Linear."""
    torch.manual_seed(seed)
    return mlp(IN, CLASSES, hidden=(16, 24, 16))


def batches(batch: int, steps: int = STEPS, seed: int = 1) -> Batches:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch, IN, generator=g), torch.randint(0, CLASSES, (batch,), generator=g))
        for _ in range(steps)
    ]


def config(**flags: Any) -> RunConfig:
    base: dict[str, Any] = {"lr": 0.1, "optimizer": "momentum"}
    return load({**base, **flags})


def _optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def reference(net: nn.Module, data: Batches) -> tuple[nn.Module, list[float]]:
    """The unsplit model trained on one process: its final state (grads kept) and losses."""
    net = copy.deepcopy(net)
    opt = _optimizer(net.parameters())
    losses = []
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return net, losses


def train(strategy: Any, net: nn.Module, data: Batches) -> tuple[nn.Module, list[float]]:
    """Drive ``strategy`` as the trainer does; its local part and rank 0's logged losses."""
    part = strategy.prepare_model(net, data[0][0])
    opt = _optimizer(part.parameters())
    strategy.setup(part, opt)
    losses = []
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        loss = strategy.forward_backward(x, y)
        strategy.after_backward()
        opt.step()
        strategy.after_step(len(losses) + 1)
        losses.append(float(loss))
    return part, losses
