"""Contiguous shards of the flat parameter vector."""

from __future__ import annotations

import itertools

import pytest
import torch

from disttrain.ps.sharding import flatten, shard_bounds, unflatten_into


def test_bounds_cover_everything_contiguously_and_differ_by_at_most_one() -> None:
    for total, k in ((10, 1), (10, 3), (7, 7), (1000, 4)):
        bounds = shard_bounds(total, k)
        assert bounds[0][0] == 0 and bounds[-1][1] == total
        assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
        sizes = [hi - lo for lo, hi in bounds]
        assert max(sizes) - min(sizes) <= 1 and min(sizes) > 0
    with pytest.raises(ValueError):
        shard_bounds(3, 4)


def test_flatten_and_unflatten_round_trip_with_missing_gradients_as_zeros() -> None:
    a, b = torch.randn(2, 3), torch.randn(4)
    flat = flatten([a, None], [a, b])
    assert torch.equal(flat[:6], a.reshape(-1)) and torch.equal(flat[6:], torch.zeros(4))
    x, y = torch.empty(2, 3), torch.empty(4)
    unflatten_into(flatten([a, b], [a, b]), [x, y])
    assert torch.equal(x, a) and torch.equal(y, b)
    with pytest.raises(ValueError):
        unflatten_into(torch.zeros(11), [x, y])
