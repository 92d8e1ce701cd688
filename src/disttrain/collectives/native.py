"""The backend's own allreduce (gloo or NCCL), metered by its documented cost.

Its halves are torch's ``reduce_scatter_single`` and ``all_gather_single``
(both run on gloo here). These take equal slots, so the balanced chunks (sizes
differing by one) are padded to ``ceil(len/n)`` elements each on the way in and
copied back out: one extra copy of the tensor, and up to n-1 padding elements on
the wire. Their traffic is estimated as a ring's: n-1 messages of one padded slot.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain.collectives.base import AllReduceAlgorithm, Cost, register
from disttrain.collectives.chunks import chunk_bounds
from disttrain.collectives.costs import Path, two_phase_path
from disttrain.comm.meter import record_send
from disttrain.comm.p2p import global_rank

__all__ = ["Native"]


@register
class Native(AllReduceAlgorithm):
    """``torch.distributed.all_reduce``; its traffic is not observable, so it is estimated.

    Both gloo (large tensors) and NCCL use a ring: each rank sends
    2(n-1) chunks of S/n bytes to its right neighbour. Any world size.
    """

    name = "native"
    estimated = True  # the meter records the documented cost
    shards = True

    def reduce_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        dist.all_reduce(flat, group=group)
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        cost = self.cost(flat.numel() * flat.element_size(), n, rank)
        record_send(global_rank(group, (rank + 1) % n), cost.bytes_sent, cost.messages, True)

    def cost(self, nbytes: int, world_size: int, rank: int = 0, itemsize: int = 1) -> Cost:
        if world_size == 1 or nbytes == 0:
            return Cost(0, 0)
        return Cost(2 * (world_size - 1) * nbytes // world_size, 2 * (world_size - 1))

    def chain(self, nbytes: int, n: int, itemsize: int) -> Path:
        return two_phase_path(self, nbytes, n, itemsize)  # gloo's ring at these sizes

    # --- the halves: torch's equal-slot collectives, padded ---------------------------
    @staticmethod
    def _slots(flat: torch.Tensor, n: int) -> tuple[torch.Tensor, list[tuple[int, int]], int]:
        bounds = chunk_bounds(flat.numel(), n)
        slot = bounds[0][1]  # the largest chunk: ceil(len / n)
        return flat.new_zeros(n * slot), bounds, slot

    def _meter(self, flat: torch.Tensor, group: ProcessGroup | None, cost: Cost) -> None:
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        record_send(global_rank(group, (rank + 1) % n), cost.bytes_sent, cost.messages, True)

    def reduce_scatter_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        padded, bounds, slot = self._slots(flat, n)
        for i, (a, b) in enumerate(bounds):
            padded[i * slot : i * slot + b - a] = flat[a:b]
        a, b = bounds[rank]
        out = flat.new_empty(slot)
        dist.reduce_scatter_single(out, padded, group=group)
        flat[a:b] = out[: b - a]
        cost = self.reduce_scatter_cost(flat.numel() * flat.element_size(), n, rank,
                                        flat.element_size())  # fmt: skip
        self._meter(flat, group, cost)

    def all_gather_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        padded, bounds, slot = self._slots(flat, n)
        a, b = bounds[rank]
        mine = flat.new_zeros(slot)
        mine[: b - a] = flat[a:b]
        dist.all_gather_single(padded, mine, group=group)
        for i, (a, b) in enumerate(bounds):
            flat[a:b] = padded[i * slot : i * slot + b - a]
        cost = self.all_gather_cost(flat.numel() * flat.element_size(), n, rank,
                                    flat.element_size())  # fmt: skip
        self._meter(flat, group, cost)

    def reduce_scatter_cost(
        self, nbytes: int, world_size: int, rank: int = 0, itemsize: int = 1
    ) -> Cost:
        n = world_size
        if n == 1 or nbytes == 0:
            return Cost(0, 0)
        slot = -(-(nbytes // itemsize) // n)  # padded: ceil(len / n) elements
        return Cost((n - 1) * slot * itemsize, n - 1)

    def all_gather_cost(
        self, nbytes: int, world_size: int, rank: int = 0, itemsize: int = 1
    ) -> Cost:
        return self.reduce_scatter_cost(nbytes, world_size, rank, itemsize)
