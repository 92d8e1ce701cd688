"""A model's buffers kept equal across replicas: which count, rank 0's broadcast, or averaged.

Parameters are what the strategies reduce; buffers are the rest of a model's state
(BatchNorm's ``running_mean``, ``running_var`` and ``num_batches_tracked``), which each
replica's forward updates from its own batch, so replicas drift apart unless told.

    broadcast_buffers(model, 0, group)          # synchronous replicas, before each forward
    average_buffers(model, algorithm, group)    # local SGD, DiLoCo: at each sync point
    broadcast_tensors(integer_buffers(model))   # ranks that ran apart: rank 0's counts

Which count: the *persistent* buffers (those in ``state_dict``: what is saved and
evaluated). A non-persistent buffer (a rotary ``inv_freq``, a causal mask) is a constant
derived from the configuration, equal everywhere, and never worth a message. Of those,
the floating ones change in training (running statistics): they are the ones sent. The
integer ones (``num_batches_tracked``) count forwards: equal on every rank of a strategy
whose ranks step in lockstep, so they are sent only where ranks run different numbers
of steps (asynchronous parameter servers), as rank 0's (a count has no meaningful mean).
A model without such buffers costs nothing: no collective is started.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed import ProcessGroup

from disttrain import collectives
from disttrain.dataparallel.average import average
from disttrain.dataparallel.broadcast import broadcast_tensors

__all__ = ["average_buffers", "broadcast_buffers", "floating_buffers", "integer_buffers"]


def _persistent_buffers(model: nn.Module) -> list[torch.Tensor]:
    """Every persistent buffer of ``model``, each tensor once, in module order (the same
    on every rank for the same model)."""
    seen: set[int] = set()
    out: list[torch.Tensor] = []
    for module in model.modules():  # each module once, even where shared
        skip = module._non_persistent_buffers_set
        for name, buf in module._buffers.items():
            if buf is not None and name not in skip and id(buf) not in seen:
                seen.add(id(buf))
                out.append(buf)
    return out


def floating_buffers(model: nn.Module) -> list[torch.Tensor]:
    """The buffers that change in training and are kept consistent (running statistics)."""
    return [b for b in _persistent_buffers(model) if b.is_floating_point()]


def integer_buffers(model: nn.Module) -> list[torch.Tensor]:
    """The counting buffers (``num_batches_tracked``): equal where ranks step in lockstep."""
    return [b for b in _persistent_buffers(model) if not b.is_floating_point()]


def broadcast_buffers(model: nn.Module, src: int = 0, group: ProcessGroup | None = None) -> bool:
    """Give every rank of ``group`` group rank ``src``'s floating buffers, as torch DDP's
    ``broadcast_buffers=True`` does before each forward: one metered message per dtype.
    False, with nothing sent, if there are none."""
    buffers = floating_buffers(model)
    if not buffers:
        return False
    broadcast_tensors(buffers, src, group)
    return True


def average_buffers(
    model: nn.Module,
    algorithm: collectives.Algorithm = "native",
    group: ProcessGroup | None = None,
    world_size: int | None = None,
) -> bool:
    """Replace each floating buffer by its mean over the ranks of ``group`` (one
    :func:`~disttrain.dataparallel.average.average` per dtype: it sends one flat buffer,
    and a bf16 model's float32 statistics must not be cast). The mean of running
    statistics is what local SGD's average of replicas means for them: each replica's
    estimate from its own data, combined. False, with nothing sent, if there are none."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for buf in floating_buffers(model):
        by_dtype.setdefault(buf.dtype, []).append(buf)
    for same in by_dtype.values():
        average(same, algorithm, group, world_size)
    return bool(by_dtype)
