"""Tree allreduce: reduce up a binary tree to rank 0, then broadcast the sum down it.

The tree of the seed lectures: a heap-shaped binary tree (parent of r is
(r-1)//2, children 2r+1 and 2r+2). 2·ceil(log2(n+1)-1) latency terms, but the
whole array crosses every edge twice, so the root and inner nodes send up to
3·S: latency-friendly, bandwidth-poor.
"""

from __future__ import annotations

import math

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

__all__ = ["Tree"]


def _children(rank: int, n: int) -> list[int]:
    return [c for c in (2 * rank + 1, 2 * rank + 2) if c < n]


class Tree(AllReduceAlgorithm):
    """Binary-tree reduce then broadcast.

    Any world size: the heap numbering fills levels left to right, so for n
    not of the form 2^k-1 the last level is simply incomplete (some inner
    nodes have one child or none).
    """

    name = "tree"

    def reduce_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        n, r = group_size(group), group_rank(group)
        kids = _children(r, n)
        if kids:  # both children's partial sums arrive at once
            bufs = [
                buffer(self.name, i, flat.numel(), flat.dtype, flat.device)
                for i in range(len(kids))
            ]
            post([], list(zip(bufs, kids, strict=True)), group)
            for buf in bufs:
                flat.add_(buf)
        if r != 0:
            parent = (r - 1) // 2
            exchange(flat, parent, None, None, group)
            exchange(None, None, flat, parent, group)
        post([(flat, c) for c in kids], [], group)

    def cost(
        self,
        nbytes: int,
        world_size: int,
        rank: int = 0,
        itemsize: int = 1,
        op: Op = "all_reduce",
    ) -> Cost:
        # S up to the parent (not at the root) and S down to each child.
        if world_size == 1 or nbytes == 0:
            return Cost(0, 0)
        messages = (rank != 0) + len(_children(rank, world_size))
        return Cost(messages * nbytes, messages)


def _chain(algo: Tree, nbytes: int, n: int, itemsize: int) -> Path:
    # Level by level: up the tree a parent receives its children's arrays (the
    # root's cost: S per child) and adds them; down it sends them the sum.
    depth = n.bit_length() - 1
    root = algo.cost(nbytes, n, 0, itemsize)
    most = max_rank_cost(algo, nbytes, n, itemsize)
    return Path(
        2 * depth,
        2 * depth * root.bytes_sent,
        depth * root.bytes_sent,
        most.bytes_sent,
        most.messages,
        f"2·log2(n) = {2 * depth} steps",
        "2·log2(n)·2S",
    )


def _steps(algo: Tree, n: int) -> str:
    return str(2 * math.ceil(math.log2(n + 1) - 1))  # up the heap, then down


register(AlgorithmKind(Tree, CostTerms(_chain, _steps), table_position=2, calibrates=True))
