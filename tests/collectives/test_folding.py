"""Folding n ranks onto a power of two: the participants are exactly p, numbered 0..p-1."""

from __future__ import annotations

import pytest

from disttrain.collectives.folding import Fold


@pytest.mark.parametrize("n", range(1, 17))
def test_fold_maps_participants_onto_zero_to_p_minus_one(n: int) -> None:
    folds = [Fold(r, n) for r in range(n)]
    p = folds[0].p
    assert p <= n < 2 * p and p & (p - 1) == 0
    active = [f for f in folds if not f.sits_out]
    assert sorted(f.virtual for f in active) == list(range(p))
    assert all(f.real(f.virtual) == f.rank for f in active)
    # every rank that sits out is absorbed by exactly one neighbour
    absorbed = sorted(f.absorbs for f in active if f.absorbs is not None)
    assert absorbed == [f.rank for f in folds if f.sits_out]
