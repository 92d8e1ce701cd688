"""The backend's own allreduce (gloo or NCCL), metered by its documented cost.

Its halves (sharded data parallelism, docs/zero.md):

- reduce-scatter: the backend's allreduce itself (every chunk summed in place, the
  rank keeps its own), metered as one. gloo has a ``reduce_scatter_single``, but it
  is no half: measured on 2 ranks (16.8 MB, the mlp's largest group) it took 23-34 ms
  where ``all_reduce`` of the same tensor took 15-24 ms (throw-away script, load 14-17 on
  2 cores; docs/zero.md, "Where the time went"). The sums are then the allreduce
  strategy's, bit for bit, on any number of ranks.
- all-gather: one broadcast per rank of its own chunk, straight into place (as torch's
  ZeroRedundancyOptimizer spreads its shards), all started at once: no padding and no
  copy, uneven chunks included. Measured on the mlp's five groups (25.7 MB, 2 ranks,
  load 6.5-6.6): 11.5-12 ms, where ``all_gather_single`` in place took 11.7-18.4 ms and
  with a list of chunks 15.5-21 ms. Its traffic is estimated as the broadcasts': each
  rank sends its chunk to the n-1 others.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain.collectives.base import (
    AlgorithmKind,
    AllReduceAlgorithm,
    Cost,
    CostTerms,
    Op,
    register,
)
from disttrain.collectives.chunks import chunk_bounds, chunk_sizes
from disttrain.collectives.costs import Path, two_phase_path
from disttrain.comm.meter import record_send
from disttrain.comm.p2p import global_rank

__all__ = ["Native"]


class Native(AllReduceAlgorithm):
    """``torch.distributed.all_reduce``; its traffic is not observable, so it is estimated.

    Both gloo (large tensors) and NCCL use a ring: each rank sends
    2(n-1) chunks of S/n bytes to its right neighbour. Any world size.
    """

    name = "native"

    def reduce_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        dist.all_reduce(flat, group=group)
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        cost = self.cost(flat.numel() * flat.element_size(), n, rank)
        record_send(global_rank(group, (rank + 1) % n), cost.bytes_sent, cost.messages, True)

    def cost(
        self,
        nbytes: int,
        world_size: int,
        rank: int = 0,
        itemsize: int = 1,
        op: Op = "all_reduce",
    ) -> Cost:
        n = world_size
        if n == 1 or nbytes == 0:
            return Cost(0, 0)
        if op == "all_gather":  # its chunk to each other rank (one broadcast)
            own = chunk_sizes(nbytes // itemsize, n)[rank]
            return Cost((n - 1) * own * itemsize, n - 1 if own else 0)
        # the allreduce, and the reduce-scatter, which is the allreduce (module docstring)
        return Cost(2 * (n - 1) * nbytes // n, 2 * (n - 1))

    # --- the halves: the allreduce, and a broadcast of each rank's chunk -------------
    def reduce_scatter_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        # gloo's reduce_scatter_single is slower than its allreduce (module docstring)
        self.reduce_flat(flat, group)

    def all_gather_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        work = self.start("all_gather", flat, group)
        assert work is not None  # two or more ranks, non-empty (the base's template)
        work.wait()

    # gloo runs these on its own threads: no communication thread, no GIL while they run
    def start(self, op: Op, flat: torch.Tensor, group: ProcessGroup | None) -> Any:
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        if n == 1 or flat.numel() == 0:
            return None
        if op == "all_gather":
            work: Any = _broadcast_chunks(flat, group)
        else:  # the allreduce is the reduce-scatter
            work = dist.all_reduce(flat, group=group, async_op=True)
        cost = self.cost(flat.numel() * flat.element_size(), n, rank, flat.element_size(), op)
        record_send(global_rank(group, (rank + 1) % n), cost.bytes_sent, cost.messages, True)
        return work


def _broadcast_chunks(flat: torch.Tensor, group: ProcessGroup | None) -> Any:
    """Every rank's chunk broadcast from it straight into place, all started at once."""
    n = dist.get_world_size(group)
    futures = [
        dist.broadcast(
            flat[a:b], src=global_rank(group, r), group=group, async_op=True
        ).get_future()
        for r, (a, b) in enumerate(chunk_bounds(flat.numel(), n))
        if b > a  # an empty chunk (fewer elements than ranks): nothing from that rank
    ]
    return torch.futures.collect_all(futures)


def _chain(algo: Native, nbytes: int, n: int, itemsize: int) -> Path:
    return two_phase_path(algo, nbytes, n, itemsize)  # gloo's ring at these sizes


# estimated: the meter records the documented cost
register(AlgorithmKind(Native, CostTerms(_chain), estimated=True, shards=True))
