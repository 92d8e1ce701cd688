"""All-to-all allreduce: every rank sends its whole array to every other and sums locally.

One latency term, but (n-1)·S bytes out of every rank and n-1 arrays of memory:
the naive scheme of the seed slides, fine for tiny messages on few ranks.
"""

from __future__ import annotations

import torch
from torch.distributed import ProcessGroup

from disttrain.collectives.base import (
    AlgorithmKind,
    AllReduceAlgorithm,
    Cost,
    CostTerms,
    Op,
    register,
)
from disttrain.collectives.costs import Path, max_rank_cost
from disttrain.collectives.scratch import buffer
from disttrain.comm.p2p import group_rank, group_size, post

__all__ = ["AllToAll"]


class AllToAll(AllReduceAlgorithm):
    """Broadcast-everything then local reduction.

    Any world size. Every rank adds the n arrays in the same order (rank 0
    first), so float results agree bitwise across ranks.
    """

    name = "alltoall"

    def reduce_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        n, r = group_size(group), group_rank(group)
        peers = [p for p in range(n) if p != r]
        bufs = {p: buffer(self.name, p, flat.numel(), flat.dtype, flat.device) for p in peers}
        post([(flat, p) for p in peers], [(bufs[p], p) for p in peers], group)
        # All sends are done, so flat may be overwritten. Sum in rank order
        # (x_0 + x_1 + ...) on every rank, accumulating into rank 0's array.
        acc = flat if r == 0 else bufs[0]
        for p in range(1, n):
            acc.add_(flat if p == r else bufs[p])
        if r != 0:
            flat.copy_(acc)

    def cost(
        self,
        nbytes: int,
        world_size: int,
        rank: int = 0,
        itemsize: int = 1,
        op: Op = "all_reduce",
    ) -> Cost:
        # The whole array to each of the n-1 others.
        if world_size == 1 or nbytes == 0:
            return Cost(0, 0)
        return Cost((world_size - 1) * nbytes, world_size - 1)


def _chain(algo: AllToAll, nbytes: int, n: int, itemsize: int) -> Path:
    # All n-1 sends posted at once; every arriving array is added.
    own = algo.cost(nbytes, n, 0, itemsize)
    most = max_rank_cost(algo, nbytes, n, itemsize)
    return Path(
        own.messages,
        own.bytes_sent,
        own.bytes_sent,
        most.bytes_sent,
        most.messages,
        f"n−1 = {own.messages} messages",
        "(n−1)·S",
    )


def _steps(algo: AllToAll, n: int) -> str:
    return "1"  # every array sent at once


register(AlgorithmKind(AllToAll, CostTerms(_chain, _steps), calibrates=True))
