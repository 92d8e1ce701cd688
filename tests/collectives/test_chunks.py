"""Balanced chunking, and the default segment size: fusion buckets are not segmented."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from disttrain.collectives.chunks import chunk_bounds, chunk_sizes, segment_bytes, segment_count
from disttrain.collectives.ring import Ring
from disttrain.dataparallel.fusion import MB
from disttrain.strategies.allreduce import DEFAULT_FUSION_MB


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


@pytest.mark.parametrize("itemsize", [2, 4, 8])
@pytest.mark.parametrize("n", [2, 3, 4, 8, 16, 64])
def test_default_fusion_bucket_is_never_segmented(n: int, itemsize: int) -> None:
    # docs/collectives.md and docs/data-parallel.md say segment pipelining is off in
    # training at the defaults: a --fusion-mb bucket's chunks are one message each.
    bucket = int(DEFAULT_FUSION_MB * MB)
    numel = bucket // itemsize
    assert all(segment_count(size, itemsize) == 1 for size in chunk_sizes(numel, n))
    for rank in range(n):  # one message per chunk sent: n-1 steps in each phase
        assert Ring().cost(bucket, n, rank, itemsize).messages == 2 * (n - 1)


def test_segments_start_above_one_segment_per_chunk() -> None:
    # The threshold the docs state: a chunk is cut once it exceeds segment_bytes().
    seg = segment_bytes()
    assert seg == 16 << 20
    assert segment_count(seg // 4, 4) == 1
    assert segment_count(seg // 4 + 1, 4) == 2
