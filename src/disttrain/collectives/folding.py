"""Folding n ranks onto the largest power of two p <= n, for the recursive-doubling family.

The MPICH/Rabenseifner recipe (Thakur, Rabenseifner & Gropp 2005): with
r = n - p extra ranks, each even rank 2i < 2r first sends its whole array to
rank 2i+1 and sits out; the p remaining ranks run the power-of-two algorithm
under virtual ranks 0..p-1; finally each 2i+1 sends the result back to 2i.
Cost of the fold: one extra step of S each way between the r pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

from disttrain.collectives.costs import Cost, Costed

__all__ = ["Fold", "folded_chain"]


@dataclass(frozen=True)
class Fold:
    """Where group rank ``rank`` stands when ``world_size`` ranks fold onto a power of two."""

    rank: int
    world_size: int

    @property
    def p(self) -> int:
        """The largest power of two not above the world size."""
        return 1 << (self.world_size.bit_length() - 1)

    @property
    def extra(self) -> int:
        """How many ranks sit out: n - p."""
        return self.world_size - self.p

    @property
    def sits_out(self) -> bool:
        """An even rank below 2·extra: hands its array to rank+1 and waits for the sum."""
        return self.rank < 2 * self.extra and self.rank % 2 == 0

    @property
    def absorbs(self) -> int | None:
        """The rank whose array this one adds before the power-of-two phase, if any."""
        if self.rank < 2 * self.extra and self.rank % 2 == 1:
            return self.rank - 1
        return None

    @property
    def virtual(self) -> int:
        """This rank's number among the p participants (undefined if it sits out)."""
        return self.rank // 2 if self.rank < 2 * self.extra else self.rank - self.extra

    def real(self, virtual: int) -> int:
        """The group rank of participant ``virtual``."""
        return 2 * virtual + 1 if virtual < self.extra else virtual + self.extra


def folded_chain(algo: Costed, nbytes: int, n: int, itemsize: int) -> Cost:
    """The sends on the critical path of a folded algorithm: rank 0's, one after another.

    Without a fold, rank 0's own cost. With one, rank 0 sits out: it hands its array
    to rank 1 first (its cost), and rank 1's own cost holds the power-of-two phase and
    the hand-back, so the chain is the two costs in sequence.
    """
    c0 = algo.cost(nbytes, n, 0, itemsize)
    return c0 + algo.cost(nbytes, n, 1, itemsize) if Fold(0, n).extra else c0
