"""Butterfly allreduce (recursive doubling): log2 n steps, whole arrays exchanged.

In step k every rank swaps its entire array with the partner whose rank differs
in bit k and adds it (Thakur, Rabenseifner & Gropp 2005). log2 n latency terms
but log2(n)·S bytes per rank: the choice for small, latency-bound messages.
Float sums agree bitwise on all ranks because a+b == b+a exactly in IEEE.
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
from disttrain.collectives.folding import Fold, folded_chain
from disttrain.collectives.scratch import buffer
from disttrain.comm.p2p import exchange, group_rank, group_size

__all__ = ["Butterfly"]


class Butterfly(AllReduceAlgorithm):
    """Recursive doubling over whole arrays.

    Non powers of two are folded (:mod:`folding`): n - p even ranks first send
    their array to their odd neighbour, sit out the log2 p exchanges, and get
    the result back: two extra steps, S more bytes on those pairs.
    """

    name = "butterfly"

    def reduce_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        fold = Fold(group_rank(group), group_size(group))
        if fold.sits_out:
            exchange(flat, fold.rank + 1, None, None, group)
            exchange(None, None, flat, fold.rank + 1, group)
            return
        incoming = buffer(self.name, 0, flat.numel(), flat.dtype, flat.device)
        if fold.absorbs is not None:
            exchange(None, None, incoming, fold.absorbs, group)
            flat.add_(incoming)
        v, mask = fold.virtual, 1
        while mask < fold.p:
            partner = fold.real(v ^ mask)
            exchange(flat, partner, incoming, partner, group)
            flat.add_(incoming)
            mask <<= 1
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
        # log2(p) whole arrays, plus one more at each end of a folded pair.
        if world_size == 1 or nbytes == 0:
            return Cost(0, 0)
        fold = Fold(rank, world_size)
        if fold.sits_out:
            return Cost(nbytes, 1)
        messages = fold.p.bit_length() - 1 + (fold.absorbs is not None)
        return Cost(messages * nbytes, messages)


def _chain(algo: Butterfly, nbytes: int, n: int, itemsize: int) -> Path:
    # Every array received is added, except the sum handed back to a folded rank.
    fold = Fold(0, n)
    sends = folded_chain(algo, nbytes, n, itemsize)
    added = sends.bytes_sent - (nbytes if fold.extra else 0)
    most = max_rank_cost(algo, nbytes, n, itemsize)
    fold_note, fold_bytes = (" + 2 fold steps", " + 2S") if fold.extra else ("", "")
    return Path(
        sends.messages,
        sends.bytes_sent,
        added,
        most.bytes_sent,
        most.messages,
        f"log2(n){fold_note} = {sends.messages} steps",
        f"log2(n)·S{fold_bytes}",
    )


def _steps(algo: Butterfly, n: int) -> str:
    # log2 n exchanges; a folded n has no single closed form
    return str(int(math.log2(n))) if n & (n - 1) == 0 else "-"


register(AlgorithmKind(Butterfly, CostTerms(_chain, _steps), table_position=3))
