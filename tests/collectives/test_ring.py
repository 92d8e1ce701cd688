"""The segment-pipelined ring with segments far smaller than the chunks, on real process groups.

The property tests in test_base.py use lengths up to 20,000 elements, all
under one default segment (16 MiB), so they never cut a chunk. Here the segment
size is a few bytes: every chunk is cut into many segments (and, with sizes not
divisible by the segment size, into segments of unequal length). Checked:
equal to ``dist.all_reduce`` exactly (integer-valued data), and the meter
equals ``cost()``, one message per segment.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.harness import run_world

LENGTHS = [1, 2, 3, 5, 17, 1001]
DTYPES = [torch.float32, torch.float64, torch.bfloat16]


def _body(segment: int) -> list[tuple[int, int]]:
    import torch.distributed as dist

    from disttrain import collectives
    from disttrain.collectives import chunks
    from disttrain.comm import meter

    chunks.set_segment_bytes(segment)
    collectives.set_length_check(False)
    me, n = dist.get_rank(), dist.get_world_size()
    ring = collectives.get("ring")
    counted: list[tuple[int, int]] = []
    for length in LENGTHS:
        for dtype in DTYPES:
            gen = torch.Generator().manual_seed(length * 31 + me)
            x = torch.randint(-9, 10, (length,), generator=gen).to(dtype)
            expected = x.clone()
            dist.all_reduce(expected)
            meter.reset()
            ring.all_reduce(x)
            assert torch.equal(x, expected), f"length {length} {dtype}"
            cost = ring.cost(length * x.element_size(), n, me, x.element_size())
            sent = (meter.bytes_sent, meter.messages_sent)
            assert sent == (cost.bytes_sent, cost.messages), f"{sent} != {cost}, length {length}"
            counted.append(sent)
    return counted


@pytest.mark.parametrize("n", [2, 3, 4])
def test_segmented_ring_matches_native_and_its_cost(n: int) -> None:
    results: list[Any] = run_world(_body, n, args=(24,), timeout=150)
    # 1001 float64 on n ranks: chunks of ~8008/n bytes, each cut into 24-byte segments.
    messages = [r[-2][1] for r in results]
    assert all(m > 2 * (n - 1) * 8008 // n // 24 for m in messages), messages


def test_segment_counts() -> None:
    from disttrain.collectives import chunks

    old = chunks.set_segment_bytes(8)
    try:
        assert chunks.segment_count(0, 4) == 0
        assert chunks.segment_bounds(0, 4) == []
        assert chunks.segment_count(5, 4) == 3  # 20 bytes / 8 -> 3 segments of 2,2,1
        assert chunks.segment_bounds(5, 4) == [(0, 2), (2, 4), (4, 5)]
        assert chunks.segment_count(3, 8) == 3  # never more segments than elements
        with pytest.raises(ValueError):
            chunks.set_segment_bytes(0)
    finally:
        chunks.set_segment_bytes(old)
