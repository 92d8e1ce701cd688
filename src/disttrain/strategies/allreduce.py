"""Synchronous data parallelism: gradients averaged by an allreduce after every backward.

N workers at global batch B then take exactly the steps one process takes at
batch B: each worker's loss is the mean over its B/N samples, so the mean of
the N gradients is the gradient of the mean loss over all B.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from disttrain import collectives
from disttrain.comm.meter import record_send
from disttrain.strategies.base import Strategy, register

__all__ = ["AllReduce", "broadcast_tensors"]


def broadcast_tensors(tensors: list[torch.Tensor], src: int = 0) -> None:
    """Copy ``tensors`` from rank ``src`` to every rank (one flat message), metered."""
    if dist.get_world_size() == 1 or not tensors:
        return
    flat = _flatten_dense_tensors([t.detach() for t in tensors])
    dist.broadcast(flat, src=src)
    if dist.get_rank() == src:
        # gloo broadcasts from the root to each rank in turn
        for peer in range(dist.get_world_size()):
            if peer != src:
                record_send(peer, flat.numel() * flat.element_size(), estimated=True)
    with torch.no_grad():
        for t, v in zip(tensors, _unflatten_dense_tensors(flat, tensors), strict=True):
            t.copy_(v)


@register
class AllReduce(Strategy):
    """Average every gradient with ``--algorithm`` after backward."""

    name = "allreduce"

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        super().setup(model, optimizer)
        self.algorithm = collectives.get(self.config.train.algorithm)
        broadcast_tensors(list(model.state_dict().values()))

    def after_backward(self) -> None:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if self.world.world_size == 1 or not grads:
            return
        flat = _flatten_dense_tensors(grads)
        self.algorithm.all_reduce(flat)
        flat /= self.world.world_size
        for g, v in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            g.copy_(v)
