"""Gradient accumulation: one step's batch as K micro-batches, communicating on the last only."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

from disttrain import timeline

__all__ = ["accumulated_forward_backward"]


def accumulated_forward_backward(
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    accumulate: int,
    no_sync: Callable[[], AbstractContextManager[Any]],
) -> torch.Tensor:
    """Forward and backward over ``accumulate`` near-equal micro-batches of (x, y).

    ``tensor_split`` gives K near-equal parts (fewer if the shard is smaller than K);
    weighting each part's mean loss by its share keeps the exact gradient of the whole
    shard's mean. Every backward but the last runs inside ``no_sync()`` (the reducer keeps
    the gradients local), the last one communicates. Returns the shard's mean loss.
    """
    parts = [
        (a, b)
        for a, b in zip(x.tensor_split(accumulate), y.tensor_split(accumulate), strict=True)
        if len(a)
    ]
    total = torch.zeros(())
    for i, (xm, ym) in enumerate(parts):
        last = i == len(parts) - 1
        with nullcontext() if last else no_sync():
            with timeline.span("forward", microbatch=i):
                loss = loss_fn(model(xm), ym) * (len(xm) / len(x))
            with timeline.span("backward", microbatch=i):
                loss.backward()
        total = total + loss.detach().cpu()
    return total
