"""Ring allreduce: reduce-scatter then all-gather, each rank sending only to its right neighbour.

Baidu's ring allreduce (Gibiansky 2017, Horovod): the tensor is cut into n
chunks; in n-1 reduce-scatter steps each rank passes a partial sum one hop to
the right and adds the chunk arriving from the left, so that rank r ends with
the full sum of chunk (r+1) mod n; n-1 all-gather steps then pass the finished
chunks around. Per rank: 2(n-1) messages and 2(n-1)/n·S bytes, independent of
n for large n: bandwidth-optimal, but 2(n-1) latency terms.
"""

from __future__ import annotations

import torch
from torch.distributed import ProcessGroup

from disttrain.collectives.base import AllReduceAlgorithm, Cost, register
from disttrain.collectives.chunks import chunk_bounds, chunk_sizes
from disttrain.collectives.scratch import buffer
from disttrain.comm.p2p import exchange, group_rank, group_size

__all__ = ["Ring"]


@register
class Ring(AllReduceAlgorithm):
    """Ring reduce-scatter + all-gather.

    Any world size: a ring needs no power of two. Lengths not divisible by n
    give chunks differing by one element; fewer elements than ranks give empty
    chunks, whose messages are skipped by both sides.
    """

    name = "ring"

    def reduce_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        n, r = group_size(group), group_rank(group)
        right, left = (r + 1) % n, (r - 1) % n
        bounds = chunk_bounds(flat.numel(), n)
        chunks = [flat[a:b] for a, b in bounds]
        # One scratch buffer of the largest chunk, reused for every step.
        scratch = buffer(self.name, 0, bounds[0][1] - bounds[0][0], flat.dtype)
        for step in range(n - 1):  # reduce-scatter
            send_i, recv_i = (r - step) % n, (r - step - 1) % n
            incoming = scratch[: chunks[recv_i].numel()]
            exchange(chunks[send_i], right, incoming, left, group)
            chunks[recv_i].add_(incoming)
        for step in range(n - 1):  # all-gather: receive straight into place
            send_i, recv_i = (r + 1 - step) % n, (r - step) % n
            exchange(chunks[send_i], right, chunks[recv_i], left, group)

    def cost(self, nbytes: int, world_size: int, rank: int = 0, itemsize: int = 1) -> Cost:
        # Rank r sends every chunk but (r+1) in the reduce-scatter and every
        # chunk but (r+2) in the all-gather: 2S - c[r+1] - c[r+2] = 2(n-1)/n·S.
        n = world_size
        if n == 1 or nbytes == 0:
            return Cost(0, 0)
        sizes = [s * itemsize for s in chunk_sizes(nbytes // itemsize, n)]
        sent = [sizes[(rank - s) % n] for s in range(n - 1)]
        sent += [sizes[(rank + 1 - s) % n] for s in range(n - 1)]
        return Cost(sum(sent), sum(1 for b in sent if b))
