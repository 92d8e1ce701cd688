"""Balanced chunking: sizes differ by at most one and cover the tensor exactly."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from disttrain.collectives.chunks import chunk_bounds, chunk_sizes


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_chunks_cover_in_order_and_differ_by_at_most_one(numel: int, parts: int) -> None:
    sizes = chunk_sizes(numel, parts)
    bounds = chunk_bounds(numel, parts)
    assert len(sizes) == parts and sum(sizes) == numel
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the larger chunks come first
    assert bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))


def test_fewer_elements_than_parts_gives_empty_chunks() -> None:
    assert chunk_sizes(2, 4) == [1, 1, 0, 0]
