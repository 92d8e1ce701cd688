"""The backend's own allreduce (gloo or NCCL), metered by its documented cost.

Its halves (sharded data parallelism, docs/zero.md):

- reduce-scatter: the backend's allreduce itself (every chunk summed in place, the
  rank keeps its own), metered as one. gloo has a ``reduce_scatter_single``, but it
  is no half: measured on 2 ranks (16.8 MB, the mlp's largest group) it took 23-34 ms
  where ``all_reduce`` of the same tensor took 15-24 ms (throw-away script, load 14-17 on
  2 cores; docs/zero.md, "Where the time went"). The sums are then the allreduce
  strategy's, bit for bit, on any number of ranks.
- all-gather: torch's ``all_gather_single``, in place (this rank's chunk is the input,
  a view of the output, as FSDP2 passes it) when every chunk has the same length. It
  takes equal slots, so uneven chunks (sizes differing by one) are padded to
  ``ceil(len/n)`` elements on the way in and copied back out. Its traffic is estimated
  as a ring's: n-1 messages of one (padded) slot.
"""

from __future__ import annotations

from typing import Any

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

    # --- the halves: the allreduce, and torch's equal-slot all-gather ----------------
    @staticmethod
    def _slots(flat: torch.Tensor, n: int) -> tuple[torch.Tensor, list[tuple[int, int]], int]:
        bounds = chunk_bounds(flat.numel(), n)
        slot = bounds[0][1]  # the largest chunk: ceil(len / n)
        return flat.new_zeros(n * slot), bounds, slot

    def _meter(self, flat: torch.Tensor, group: ProcessGroup | None, cost: Cost) -> None:
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        record_send(global_rank(group, (rank + 1) % n), cost.bytes_sent, cost.messages, True)

    def reduce_scatter_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        # gloo's reduce_scatter_single is slower than its allreduce (module docstring)
        self.reduce_flat(flat, group)

    # gloo runs these on its own threads: no communication thread, no GIL while they run
    def start_all_reduce(self, flat: torch.Tensor, group: ProcessGroup | None) -> Any:
        n = dist.get_world_size(group)
        if n == 1 or flat.numel() == 0:
            return None
        work = dist.all_reduce(flat, group=group, async_op=True)
        self._meter(flat, group, self.cost(flat.numel() * flat.element_size(), n))
        return work

    def start_reduce_scatter(self, flat: torch.Tensor, group: ProcessGroup | None) -> Any:
        return self.start_all_reduce(flat, group)  # the allreduce is the reduce-scatter

    def start_all_gather(self, flat: torch.Tensor, group: ProcessGroup | None) -> Any:
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        if n == 1 or flat.numel() == 0 or flat.numel() % n:  # uneven: padded, blocking
            return None
        a, b = chunk_bounds(flat.numel(), n)[rank]
        work = dist.all_gather_single(flat, flat[a:b], group=group, async_op=True)
        nbytes = flat.numel() * flat.element_size()
        self._meter(flat, group, self.all_gather_cost(nbytes, n, rank, flat.element_size()))
        return work

    def all_gather_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        bounds = chunk_bounds(flat.numel(), n)
        a, b = bounds[rank]
        if flat.numel() % n == 0:  # equal chunks: the slots are the chunks, no copy
            dist.all_gather_single(flat, flat[a:b], group=group)
        else:
            padded, _, slot = self._slots(flat, n)
            mine = flat.new_zeros(slot)
            mine[: b - a] = flat[a:b]
            dist.all_gather_single(padded, mine, group=group)
            for i, (c, d) in enumerate(bounds):
                flat[c:d] = padded[i * slot : i * slot + d - c]
        cost = self.all_gather_cost(flat.numel() * flat.element_size(), n, rank,
                                    flat.element_size())  # fmt: skip
        self._meter(flat, group, cost)

    def reduce_scatter_cost(
        self, nbytes: int, world_size: int, rank: int = 0, itemsize: int = 1
    ) -> Cost:
        return self.cost(nbytes, world_size, rank, itemsize)  # it is the allreduce

    def all_gather_cost(
        self, nbytes: int, world_size: int, rank: int = 0, itemsize: int = 1
    ) -> Cost:
        n = world_size
        if n == 1 or nbytes == 0:
            return Cost(0, 0)
        slot = -(-(nbytes // itemsize) // n)  # padded: ceil(len / n) elements
        return Cost((n - 1) * slot * itemsize, n - 1)
