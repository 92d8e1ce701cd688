"""Halving-doubling allreduce (Rabenseifner): recursive-halving reduce-scatter, doubling all-gather.

Reduce-scatter: in step k each rank sends the half of its current segment that
its partner (rank XOR p/2^(k+1)) keeps and adds the half it keeps, so segments
halve until each of the p ranks holds one fully summed chunk; the all-gather
retraces the steps, doubling the segments. 2·log2 p latency terms and
2(p-1)/p·S bytes per rank: bandwidth-optimal like the ring, with fewer steps
(Thakur, Rabenseifner & Gropp 2005).
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
from disttrain.collectives.chunks import chunk_bounds, chunk_sizes
from disttrain.collectives.costs import Path, max_rank_cost
from disttrain.collectives.folding import Fold, folded_chain
from disttrain.collectives.scratch import buffer
from disttrain.comm.p2p import exchange, group_rank, group_size

__all__ = ["HalvingDoubling"]


def _schedule(v: int, p: int) -> list[tuple[int, tuple[int, int], tuple[int, int]]]:
    """Reduce-scatter steps of participant ``v``: (partner, chunks kept, chunks sent).

    Chunk ranges are [lo, hi) in units of the p balanced chunks; the all-gather
    runs the same list backwards with kept/sent swapped.
    """
    steps = []
    lo, hi, mask = 0, p, p >> 1
    while mask:
        mid = (lo + hi) // 2
        keep, give = ((mid, hi), (lo, mid)) if v & mask else ((lo, mid), (mid, hi))
        steps.append((v ^ mask, keep, give))
        lo, hi = keep
        mask >>= 1
    return steps


class HalvingDoubling(AllReduceAlgorithm):
    """Recursive halving then doubling over p balanced chunks.

    Non powers of two are folded (:mod:`folding`): n - p even ranks send their
    whole array to their odd neighbour first and receive the result at the end.
    Lengths not divisible by p give chunks differing by one element.
    """

    name = "halving_doubling"

    def reduce_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        fold = Fold(group_rank(group), group_size(group))
        if fold.sits_out:
            exchange(flat, fold.rank + 1, None, None, group)
            exchange(None, None, flat, fold.rank + 1, group)
            return
        if fold.absorbs is not None:
            incoming = buffer(self.name, 1, flat.numel(), flat.dtype, flat.device)
            exchange(None, None, incoming, fold.absorbs, group)
            flat.add_(incoming)
        bounds = chunk_bounds(flat.numel(), fold.p)

        def span(chunks: tuple[int, int]) -> torch.Tensor:
            return flat[bounds[chunks[0]][0] : bounds[chunks[1] - 1][1]]

        steps = _schedule(fold.virtual, fold.p)
        # The first (lower) half is the largest segment ever kept: chunks are front-loaded.
        scratch = buffer(self.name, 0, span((0, fold.p // 2)).numel(), flat.dtype, flat.device)
        for partner, keep, give in steps:
            mine = span(keep)
            incoming = scratch[: mine.numel()]
            peer = fold.real(partner)
            exchange(span(give), peer, incoming, peer, group)
            mine.add_(incoming)
        for partner, keep, give in reversed(steps):
            peer = fold.real(partner)
            exchange(span(keep), peer, span(give), peer, group)
        if fold.absorbs is not None:
            exchange(flat, fold.absorbs, None, None, group)

    def cost(
        self,
        nbytes: int,
        world_size: int,
        rank: int = 0,
        itemsize: int = 1,
        op: Op = "all_reduce",
    ) -> Cost:
        # Sum over steps of the half given away plus the segment held at each
        # doubling step: 2(p-1)/p·S when p divides the length; S more to a folded partner.
        if world_size == 1 or nbytes == 0:
            return Cost(0, 0)
        fold = Fold(rank, world_size)
        if fold.sits_out:
            return Cost(nbytes, 1)
        sizes = [s * itemsize for s in chunk_sizes(nbytes // itemsize, fold.p)]
        sent = []
        for _, keep, give in _schedule(fold.virtual, fold.p):
            sent += [sum(sizes[give[0] : give[1]]), sum(sizes[keep[0] : keep[1]])]
        if fold.absorbs is not None:
            sent.append(nbytes)
        return Cost(sum(sent), sum(1 for b in sent if b))


def _chain(algo: HalvingDoubling, nbytes: int, n: int, itemsize: int) -> Path:
    # Only the recursive-halving half is added (the doubling half is copies), plus
    # the folded rank's array, added once; its hand-over and hand-back are S each.
    fold = Fold(0, n)
    sends = folded_chain(algo, nbytes, n, itemsize)
    fold_bytes = nbytes if fold.extra else 0
    added = (sends.bytes_sent - 2 * fold_bytes) // 2 + fold_bytes
    most = max_rank_cost(algo, nbytes, n, itemsize)
    fold_note, fold_text = (" + 2 fold steps", " + 2S") if fold.extra else ("", "")
    return Path(
        sends.messages,
        sends.bytes_sent,
        added,
        most.bytes_sent,
        most.messages,
        f"2·log2(n){fold_note} = {sends.messages} steps",
        f"2(n−1)/n·S{fold_text}",
    )


def _steps(algo: HalvingDoubling, n: int) -> str:
    # log2 n halving steps, then as many doubling steps; no closed form when folded
    return str(2 * int(math.log2(n))) if n & (n - 1) == 0 else "-"


register(AlgorithmKind(HalvingDoubling, CostTerms(_chain, _steps)))
