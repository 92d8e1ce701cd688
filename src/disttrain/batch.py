"""What a batch is: how it calls the model and the loss, how it is cut and moved.

Three shapes of batch, as people write them (the issue's contract, docs/training.md):

- an ``(inputs, target)`` pair (a list or tuple of two): ``model(inputs)``, then
  ``loss_fn(output, target)``;
- a dict (Hugging Face's convention): ``model(**batch)``, then ``output.loss`` when no
  ``loss_fn`` is given, else ``loss_fn(output, batch)``;
- anything else (a bare tensor): ``model(batch)``, then ``loss_fn(output, batch)``, or
  the output itself (or its ``.loss``) when it is the loss already.

A strategy sees a batch as ``(x, y)``: ``x`` is what the model is called with and ``y``
what the loss reads besides the output. Cutting either (gradient accumulation's
micro-batches) cuts every tensor in it along its first dimension.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from disttrain.comm.errors import UsageError

__all__ = [
    "LossFn",
    "call_model",
    "checked_loss",
    "inputs_and_target",
    "loss_for",
    "num_samples",
    "output_loss",
    "split",
    "to_device",
]

#: loss_fn(output, target) -> a scalar tensor
LossFn = Callable[[Any, Any], torch.Tensor]


def call_model(model: nn.Module, inputs: Any) -> Any:
    """``model(**inputs)`` for a dict of inputs, ``model(inputs)`` otherwise."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    return model(inputs)


def inputs_and_target(batch: Any) -> tuple[Any, Any]:
    """``(x, y)`` of a batch: a pair's two parts; a dict or a tensor is both."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    if isinstance(batch, (tuple, list)):
        raise UsageError(
            f"a batch that is a {type(batch).__name__} must be an (inputs, target) pair, "
            f"got {len(batch)} items: yield a pair, a dict, or a tensor, or pass forward="
        )
    return batch, batch


def output_loss(output: Any) -> torch.Tensor:
    """The loss a model returned itself: ``output.loss`` (or ``output["loss"]``), or the
    output when it is a scalar tensor."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, Mapping):
        loss = output.get("loss")
    if loss is None and isinstance(output, torch.Tensor) and output.dim() == 0:
        loss = output
    if not isinstance(loss, torch.Tensor):
        raise UsageError(
            f"the model's output ({type(output).__name__}) has no loss: pass loss_fn, or "
            "include the labels in the batch so that the model returns output.loss"
        )
    return loss


def loss_for(batch: Any, loss_fn: LossFn | None) -> LossFn:
    """The ``(output, y) -> loss`` a batch of this shape is trained with."""
    if isinstance(batch, (tuple, list)):
        if loss_fn is None:
            raise UsageError(
                "an (inputs, target) batch needs a loss: run.step(batch, loss_fn), "
                "loss_fn(output, target) returning a scalar tensor"
            )
        return loss_fn
    if loss_fn is None:
        return lambda output, y: output_loss(output)
    return loss_fn


def checked_loss(loss: Any) -> torch.Tensor:
    """``loss`` if it is a scalar tensor; else one line naming what it is."""
    if not isinstance(loss, torch.Tensor):
        raise UsageError(f"the loss must be a scalar tensor, got a {type(loss).__name__}")
    if loss.dim() != 0:
        raise UsageError(
            f"the loss must be a scalar tensor, got shape {tuple(loss.shape)}: reduce it "
            "(.mean() or .sum()) in loss_fn"
        )
    return loss


def num_samples(batch: Any) -> int:
    """The samples in a batch: the first dimension of its first tensor."""
    leaves = [t for t in tree_flatten(batch)[0] if isinstance(t, torch.Tensor) and t.dim() > 0]
    if not leaves:
        raise UsageError(f"a batch must hold at least one tensor, got {type(batch).__name__}")
    return int(leaves[0].shape[0])


def split(batch: Any, parts: int) -> list[Any]:
    """``parts`` near-equal pieces of ``batch`` (``tensor_split`` of every tensor along its
    first dimension; other leaves are shared), dropping empty ones."""
    if batch is None:
        return [None] * parts
    n = num_samples(batch)
    pieces, lo = [], 0
    for i in range(parts):  # tensor_split's sizes: the first n mod parts one larger
        hi = lo + n // parts + (1 if i < n % parts else 0)
        if hi > lo:
            pieces.append(_narrow(batch, lo, hi))
        lo = hi
    return pieces


def _narrow(batch: Any, lo: int, hi: int) -> Any:
    def cut(t: Any) -> Any:
        return t[lo:hi] if isinstance(t, torch.Tensor) and t.dim() > 0 else t

    if isinstance(batch, Mapping) and not isinstance(batch, dict):  # BatchEncoding, ...
        kind: Any = type(batch)
        return kind({k: _narrow(v, lo, hi) for k, v in batch.items()})
    return tree_map(cut, batch)


def to_device(batch: Any, device: torch.device) -> Any:
    """Every tensor of ``batch`` on ``device`` (non-blocking from pinned memory)."""
    if isinstance(batch, Mapping) and not isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}

    def move(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.device != device:
            return t.to(device, non_blocking=True)
        return t

    return tree_map(move, batch)
