"""Star (master-worker) allreduce: every rank sends to rank 0, which sums and sends the result back.

The parameter-server shape of the seed slides: two latency terms, but the root
receives and sends (n-1)·S, so it is the bottleneck as n grows.
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
from disttrain.comm.p2p import exchange, group_rank, group_size, post

__all__ = ["Star"]


class Star(AllReduceAlgorithm):
    """Gather to group rank 0, reduce there, send the sum back.

    Any world size: nothing depends on n being a power of two. The root
    posts all n-1 receives at once and sums them in rank order.
    """

    name = "star"

    def reduce_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        n, r = group_size(group), group_rank(group)
        if r != 0:
            exchange(flat, 0, None, None, group)
            exchange(None, None, flat, 0, group)
            return
        bufs = [buffer(self.name, i, flat.numel(), flat.dtype, flat.device) for i in range(1, n)]
        post([], [(buf, peer) for peer, buf in enumerate(bufs, start=1)], group)
        for buf in bufs:
            flat.add_(buf)
        post([(flat, peer) for peer in range(1, n)], [], group)

    def cost(
        self,
        nbytes: int,
        world_size: int,
        rank: int = 0,
        itemsize: int = 1,
        op: Op = "all_reduce",
    ) -> Cost:
        # A leaf sends S once; the root sends S to each of the n-1 leaves.
        if world_size == 1 or nbytes == 0:
            return Cost(0, 0)
        messages = world_size - 1 if rank == 0 else 1
        return Cost(messages * nbytes, messages)


def _chain(algo: Star, nbytes: int, n: int, itemsize: int) -> Path:
    # The root receives what every leaf sends ((n-1)·S, as much as its own cost),
    # adds it, then sends its cost: 2(n-1)·S through one link, one message per leaf.
    root, leaf = algo.cost(nbytes, n, 0, itemsize), algo.cost(nbytes, n, 1, itemsize)
    most = max_rank_cost(algo, nbytes, n, itemsize)
    return Path(
        root.messages + leaf.messages,
        2 * root.bytes_sent,
        root.bytes_sent,
        most.bytes_sent,
        most.messages,
        f"n = {n} messages through the root",
        "2(n−1)·S through the root",
    )


def _steps(algo: Star, n: int) -> str:
    return "2"  # gather to the root, then send back


register(AlgorithmKind(Star, CostTerms(_chain, _steps), table_position=1, calibrates=True))
