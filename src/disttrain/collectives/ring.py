"""Ring allreduce: reduce-scatter then all-gather, each rank sending only to its right neighbour.

Baidu's ring allreduce (Gibiansky 2017, Horovod): the tensor is cut into n
chunks; in n-1 reduce-scatter steps each rank passes a partial sum one hop to
the right and adds the chunk arriving from the left, so that rank r ends with
the full sum of chunk (r+1) mod n; n-1 all-gather steps then pass the finished
chunks around. Per rank: 2(n-1)/n·S bytes, independent of n for large n:
bandwidth-optimal, but 2(n-1) latency terms.

Pipelined by segments (as gloo's and NCCL's rings are): each chunk is cut into
segments of about :func:`chunks.segment_bytes`, and a segment is forwarded to
the right as soon as it has been received and summed, while the next segments
are still on the wire. The chunk a rank receives in step s is exactly the one
it sends in step s+1 (and the last reduce-scatter chunk is the first one the
all-gather sends), so the 2(n-1) steps form one continuous stream with no
barrier between steps. Messages per rank: the segments of every chunk sent.

At the default segment (16 MiB) a chunk of a bucket up to 16 MiB is one
segment, so in training at the default --fusion-mb 4 every chunk is one message
and the segment pipelining is off; steps still overlap (step s+1's receives are
posted while step s is summed). docs/collectives.md, "Segment pipelining".

Each half is also a collective of its own (``reduce_scatter`` / ``all_gather``, for
ZeRO): the same ring, n-1 steps each, arranged so that rank r ends owning chunk r
(the balanced chunks of :mod:`chunks`), one message per non-empty chunk sent
(no segmenting). Per rank: every chunk but its own (reduce-scatter) or but its
right neighbour's (all-gather): about (n-1)/n·S each, the allreduce's two halves.
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
from disttrain.collectives.chunks import chunk_bounds, chunk_sizes, segment_bounds, segment_count
from disttrain.collectives.costs import Path, two_phase_path
from disttrain.collectives.scratch import buffer
from disttrain.comm.p2p import exchange, group_rank, group_size, irecv, isend

__all__ = ["Ring"]


class Ring(AllReduceAlgorithm):
    """Segment-pipelined ring reduce-scatter + all-gather.

    Any world size: a ring needs no power of two. Lengths not divisible by n
    give chunks differing by one element; fewer elements than ranks give empty
    chunks, which have no segments and are skipped by both sides.
    """

    name = "ring"

    def reduce_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        n, r = group_size(group), group_rank(group)
        right, left = (r + 1) % n, (r - 1) % n
        itemsize = flat.element_size()
        chunks = [flat[a:b] for a, b in chunk_bounds(flat.numel(), n)]
        segs = [[c[a:b] for a, b in segment_bounds(c.numel(), itemsize)] for c in chunks]
        # Two scratch buffers of the largest chunk, alternating by step: step s+1's
        # receives are posted while step s's are still being summed.
        largest = chunks[0].numel()
        scratch = [buffer(self.name, k, largest, flat.dtype, flat.device) for k in (0, 1)]
        steps = 2 * (n - 1)
        # Step s receives chunk (r-s-1) mod n and sends chunk (r-s) mod n, in both
        # phases; s < n-1 is the reduce-scatter (receive into scratch, then add),
        # s >= n-1 the all-gather (receive straight into place).
        sends: list[list[Any]] = [[] for _ in range(steps)]

        def post_recvs(s: int) -> list[tuple[Any, torch.Tensor]]:
            i = (r - s - 1) % n
            if s < n - 1:
                into = scratch[s % 2]
                bounds = segment_bounds(chunks[i].numel(), itemsize)
                return [(irecv(into[a:b], left, group), into[a:b]) for a, b in bounds]
            # The all-gather overwrites chunk i, which this rank sent in reduce-scatter
            # step s-(n-1): that send must be done first. (A gloo work must be waited
            # on exactly once: a second wait blocks until the timeout.)
            for work in sends[s - (n - 1)]:
                work.wait()
            sends[s - (n - 1)] = []
            return [(irecv(seg, left, group), seg) for seg in segs[i]]

        # Receives before sends: gloo moves a pair's two directions at once only if each
        # side's receive is posted before its send; posted the other way round, the two
        # ranks' transfers ran one after the other (2 hosts at 1 Gbit/s: 1.46x native's
        # time; bench cluster-allreduce --ranks-per-host 1)
        pending = post_recvs(0)
        sends[0] = [isend(seg, right, group) for seg in segs[r % n]]
        for s in range(steps):
            ahead = post_recvs(s + 1) if s + 1 < steps else []
            i = (r - s - 1) % n
            for (work, incoming), seg in zip(pending, segs[i], strict=True):
                work.wait()
                if s < n - 1:
                    seg.add_(incoming)
                if s + 1 < steps:  # forward it at once: step s+1 sends chunk i
                    sends[s + 1].append(isend(seg, right, group))
            pending = ahead
        for step_sends in sends:
            for work in step_sends:
                work.wait()

    def cost(
        self,
        nbytes: int,
        world_size: int,
        rank: int = 0,
        itemsize: int = 1,
        op: Op = "all_reduce",
    ) -> Cost:
        # Allreduce: rank r sends every chunk but (r+1) in the reduce-scatter and every
        # chunk but (r+2) in the all-gather: 2S - c[r+1] - c[r+2] = 2(n-1)/n·S, one message
        # per segment of each chunk sent. The halves on their own (rank r owns chunk r):
        # every chunk but r (reduce-scatter) or but r+1 (all-gather), one message per
        # non-empty chunk (no segmenting).
        n = world_size
        if n == 1 or nbytes == 0:
            return Cost(0, 0)
        sizes = chunk_sizes(nbytes // itemsize, n)
        if op != "all_reduce":
            first = 1 if op == "reduce_scatter" else 0
            half = [sizes[(rank - s - first) % n] for s in range(n - 1)]
            return Cost(sum(half) * itemsize, sum(1 for size in half if size))
        sent = [sizes[(rank - s) % n] for s in range(n - 1)]
        sent += [sizes[(rank + 1 - s) % n] for s in range(n - 1)]
        return Cost(sum(sent) * itemsize, sum(segment_count(size, itemsize) for size in sent))

    # --- the halves on their own (rank r owns chunk r) --------------------------------
    def reduce_scatter_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        # Step s sends chunk (r-s-1) (summed in step s-1) and receives chunk (r-s-2) from
        # the left, adding it in: after n-1 steps chunk (r-n) = r holds every rank's term.
        n, r = group_size(group), group_rank(group)
        chunks = [flat[a:b] for a, b in chunk_bounds(flat.numel(), n)]
        scratch = buffer(self.name, 0, chunks[0].numel(), flat.dtype, flat.device)
        for s in range(n - 1):
            out, into = chunks[(r - s - 1) % n], chunks[(r - s - 2) % n]
            incoming = scratch[: into.numel()]
            exchange(out, (r + 1) % n, incoming, (r - 1) % n, group)
            into.add_(incoming)

    def all_gather_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        # Step s forwards chunk (r-s) (own in step 0) and receives chunk (r-s-1) in place.
        n, r = group_size(group), group_rank(group)
        chunks = [flat[a:b] for a, b in chunk_bounds(flat.numel(), n)]
        for s in range(n - 1):
            exchange(chunks[(r - s) % n], (r + 1) % n, chunks[(r - s - 1) % n], (r - 1) % n, group)


def _chain(algo: Ring, nbytes: int, n: int, itemsize: int) -> Path:
    return two_phase_path(algo, nbytes, n, itemsize)


def _steps(algo: Ring, n: int) -> str:
    return str(2 * (n - 1))  # n-1 reduce-scatter steps, n-1 all-gather steps


register(
    AlgorithmKind(Ring, CostTerms(_chain, _steps), table_position=4, calibrates=True, shards=True)
)
