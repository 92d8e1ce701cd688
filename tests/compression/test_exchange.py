"""Compressed allreduce on 3 real ranks: the right sum, and the meter sees the stated sizes."""

from __future__ import annotations

import pytest
import torch

from tests.harness import run_world

N = 3000


def _input(rank: int) -> torch.Tensor:
    return torch.randn(N, generator=torch.Generator().manual_seed(100 + rank))


def _reduce(spec: str) -> tuple[list[float], int, int, int, float]:
    import torch.distributed as dist

    from disttrain.collectives import set_length_check
    from disttrain.comm import meter
    from disttrain.compression import (
        LENGTH_BYTES,
        CompressionStats,
        compressed_all_reduce,
        parse,
    )

    set_length_check(False)  # its few bytes are outside the compressor's claim
    rank, size = dist.get_rank(), dist.get_world_size()
    c = parse(spec)
    stats = CompressionStats()
    meter.reset()
    flat = _input(rank)
    payload = c.compress(flat.clone())
    compressed_all_reduce(flat, c, "native", stats=stats)
    if c.summable:
        from disttrain.collectives import get

        item = payload.data.element_size()
        claimed = get("native").cost(c.wire_bytes(payload), size, rank, item).bytes_sent
    else:
        claimed = (size - 1) * (c.wire_bytes(payload) + LENGTH_BYTES)
    return flat.tolist(), meter.bytes_sent, claimed, stats.dense_bytes, stats.ratio


@pytest.mark.parametrize("spec", ["none", "fp16", "bf16", "topk:0.01", "onebit:1.0"])
def test_sum_matches_the_decoded_payloads_and_the_meter_matches_the_claim(spec: str) -> None:
    from disttrain.compression import parse

    results = run_world(_reduce, 3, args=(spec,), timeout=60)
    c = parse(spec)
    decoded = [c.decompress(c.compress(_input(r))) for r in range(3)]
    expected = decoded[0] + decoded[1] + decoded[2]
    # casts are summed in their own 16-bit type by the allreduce: allow its rounding
    tol = {"fp16": 3e-3, "bf16": 3e-2}.get(spec, 1e-6)
    for values, metered, claimed, dense, ratio in results:
        torch.testing.assert_close(torch.tensor(values), expected, rtol=tol, atol=tol)
        assert metered == claimed > 0
        assert ratio == pytest.approx(dense / metered)
    if spec.startswith("onebit"):
        # 32% of N(0,1) entries exceed 1.0: ~3 bits of gap code + 1 sign bit each,
        # so 32 / (0.32 * 4) ~ 25x fewer bytes than fp32, less the headers
        assert 20 < results[0][4] < 32
