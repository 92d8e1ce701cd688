"""Round-robin allreduce: a direct reduce-scatter and all-gather in n-1 contention-free rounds.

Rank i owns chunk i. In round k (1..n-1) rank i sends the chunk owned by
rank (i+k) mod n to that rank and receives its own chunk from rank (i-k) mod n;
each round is a permutation, so no rank receives twice at once. The owner sums
its chunk, then n-1 more rounds hand every owner's chunk to everyone.
2(n-1)/n·S bytes per rank like the ring, but each message goes straight to
its destination instead of hopping.

Rounds are pipelined two deep: round k+1 is posted before round k's chunk is
summed (into the other of two scratch buffers), so the sum overlaps the next
transfer, and in the all-gather round k+1 is posted before round k is waited
on. So at most two rounds are in flight: a rank receives from two peers at
once, not n-1. Measured at n=4, 16 MB (disttrain bench roundrobin-depth):
1.00-1.03x native's time paired, against 1.04-1.08x one round at a time.
"""

from __future__ import annotations

from typing import Any

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
from disttrain.collectives.chunks import chunk_bounds, chunk_sizes
from disttrain.collectives.costs import Path, two_phase_path
from disttrain.collectives.scratch import buffer
from disttrain.comm.p2p import group_rank, group_size, irecv, isend

__all__ = ["RoundRobin"]


class RoundRobin(AllReduceAlgorithm):
    """Pairwise-exchange reduce-scatter + all-gather, two rounds in flight.

    Any world size: the rounds are shifts mod n, a permutation for every n.
    Uneven lengths give chunks differing by one element; empty chunks (fewer
    elements than ranks) are neither sent nor received.
    """

    name = "roundrobin"
    #: Rounds in flight at once. Two lets one round's sum (or wake-up) overlap the
    #: next round's transfer; more only adds receivers per rank and scratch buffers
    #: (disttrain bench roundrobin-depth measures 1, 2 and all).
    depth = 2

    def reduce_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        n, r = group_size(group), group_rank(group)
        depth = max(1, min(self.depth, n - 1))
        chunks = [flat[a:b] for a, b in chunk_bounds(flat.numel(), n)]
        mine = chunks[r]
        scratch = [
            buffer(self.name, k, mine.numel(), flat.dtype, flat.device) for k in range(depth)
        ]
        sends: list[Any] = []

        def post(k: int, send: torch.Tensor, recv: torch.Tensor) -> Any:
            """Post round k: ``send`` to rank r+k, ``recv`` from r-k; the receive's work."""
            to, frm = (r + k) % n, (r - k) % n
            work = irecv(recv, frm, group) if recv.numel() else None  # first (see ring.py)
            if send.numel():
                sends.append(isend(send, to, group))
            return work

        # Reduce-scatter: round k receives into scratch[k % depth]; round k+depth reuses
        # that buffer, and it is posted only after round k's sum.
        pending = [post(k, chunks[(r + k) % n], scratch[k % depth]) for k in range(1, depth)]
        for k in range(1, n):
            if k + depth - 1 < n:
                ahead = k + depth - 1
                pending.append(post(ahead, chunks[(r + ahead) % n], scratch[ahead % depth]))
            work = pending.pop(0)
            if work is not None:
                work.wait()
                mine.add_(scratch[k % depth])
        # The all-gather receives into the chunks sent above: those sends must be done.
        # (A gloo work is waited on exactly once: a second wait blocks until the timeout.)
        for work in sends:
            work.wait()
        sends.clear()
        pending = []
        for k in range(1, n):  # all-gather, straight into place
            pending.append(post(k, mine, chunks[(r - k) % n]))
            if len(pending) == depth:
                work = pending.pop(0)
                if work is not None:
                    work.wait()
        for work in [*pending, *sends]:
            if work is not None:
                work.wait()

    def cost(
        self,
        nbytes: int,
        world_size: int,
        rank: int = 0,
        itemsize: int = 1,
        op: Op = "all_reduce",
    ) -> Cost:
        # Every chunk but its own once (S - c_r), then its own to the n-1 others.
        n = world_size
        if n == 1 or nbytes == 0:
            return Cost(0, 0)
        sizes = [s * itemsize for s in chunk_sizes(nbytes // itemsize, n)]
        sent = [sizes[(rank + k) % n] for k in range(1, n)] + [sizes[rank]] * (n - 1)
        return Cost(sum(sent), sum(1 for b in sent if b))


def _chain(algo: RoundRobin, nbytes: int, n: int, itemsize: int) -> Path:
    return two_phase_path(algo, nbytes, n, itemsize)


def _steps(algo: RoundRobin, n: int) -> str:
    return str(2 * (n - 1))  # n-1 reduce-scatter rounds, n-1 all-gather rounds


register(AlgorithmKind(RoundRobin, CostTerms(_chain, _steps)))
