"""The backend's own allreduce (gloo or NCCL), metered by its documented cost."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain.collectives.base import AllReduceAlgorithm, Cost, register
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
