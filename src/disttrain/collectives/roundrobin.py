"""Round-robin allreduce: a direct reduce-scatter and all-gather in n-1 contention-free rounds.

Rank i owns chunk i. In round k (1..n-1) rank i sends the chunk owned by
rank (i+k) mod n to that rank and receives its own chunk from rank (i-k) mod n;
each round is a permutation, so no rank receives twice at once. The owner sums
its chunk, then n-1 more rounds hand every owner's chunk to everyone.
2(n-1)/n·S bytes per rank like the ring, but each message goes straight to
its destination instead of hopping.
"""

from __future__ import annotations

import torch
from torch.distributed import ProcessGroup

from disttrain.collectives.base import AllReduceAlgorithm, Cost, register
from disttrain.collectives.chunks import chunk_bounds, chunk_sizes
from disttrain.collectives.scratch import buffer
from disttrain.comm.p2p import exchange, group_rank, group_size

__all__ = ["RoundRobin"]


@register
class RoundRobin(AllReduceAlgorithm):
    """Pairwise-exchange reduce-scatter + all-gather.

    Any world size: the rounds are shifts mod n, a permutation for every n.
    Uneven lengths give chunks differing by one element; empty chunks (fewer
    elements than ranks) are not sent.
    """

    name = "roundrobin"

    def reduce_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        n, r = group_size(group), group_rank(group)
        chunks = [flat[a:b] for a, b in chunk_bounds(flat.numel(), n)]
        mine = chunks[r]
        incoming = buffer(self.name, 0, mine.numel(), flat.dtype)
        for k in range(1, n):  # reduce-scatter
            to, frm = (r + k) % n, (r - k) % n
            exchange(chunks[to], to, incoming, frm, group)
            mine.add_(incoming)
        for k in range(1, n):  # all-gather, straight into place
            to, frm = (r + k) % n, (r - k) % n
            exchange(mine, to, chunks[frm], frm, group)

    def cost(self, nbytes: int, world_size: int, rank: int = 0, itemsize: int = 1) -> Cost:
        # Every chunk but its own once (S - c_r), then its own to the n-1 others.
        n = world_size
        if n == 1 or nbytes == 0:
            return Cost(0, 0)
        sizes = [s * itemsize for s in chunk_sizes(nbytes // itemsize, n)]
        sent = [sizes[(rank + k) % n] for k in range(1, n)] + [sizes[rank]] * (n - 1)
        return Cost(sum(sent), sum(1 for b in sent if b))
