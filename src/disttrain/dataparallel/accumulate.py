"""Gradient accumulation: one step's batch as K micro-batches, communicating on the last only."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

from disttrain import timeline
from disttrain.batch import call_model, num_samples, split

__all__ = ["accumulated_forward_backward"]


def accumulated_forward_backward(
    model: nn.Module,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    x: Any,
    y: Any,
    accumulate: int,
    no_sync: Callable[[], AbstractContextManager[Any]],
    model_call: Callable[[nn.Module, Any], Any] = call_model,
) -> torch.Tensor:
    """Forward and backward over ``accumulate`` near-equal micro-batches of (x, y).

    ``x`` and ``y`` are a batch's two halves (:mod:`disttrain.batch`: tensors, or
    dicts of them, cut alike; ``y`` may be ``x`` itself); ``model_call(model, xm)`` runs
    the model. ``tensor_split`` gives K near-equal parts (fewer if the shard is smaller than K);
    weighting each part's mean loss by its share keeps the exact gradient of the whole
    shard's mean. Every backward but the last runs inside ``no_sync()`` (the reducer keeps
    the gradients local), the last one communicates. Returns the shard's mean loss.
    """
    xs = split(x, accumulate)
    ys = xs if y is x else split(y, accumulate)
    n = num_samples(x)
    total = torch.zeros(())
    for i, (xm, ym) in enumerate(zip(xs, ys, strict=True)):
        last = i == len(xs) - 1
        with nullcontext() if last else no_sync():
            with timeline.span("forward", microbatch=i):
                loss = loss_fn(model_call(model, xm), ym) * (num_samples(xm) / n)
            with timeline.span("backward", microbatch=i):
                loss.backward()
        total = total + loss.detach().cpu()
    return total
