"""Compressed allreduce on 3 real ranks: the right sum, and the meter sees the stated sizes."""

from __future__ import annotations

import pytest
import torch

from tests.harness import SharedWorlds

N = 3000


def _input(rank: int) -> torch.Tensor:
    return torch.randn(N, generator=torch.Generator().manual_seed(100 + rank))


#: a metered algorithm: the meter counts what it sends, not what its cost() says
ALGORITHM = "ring"


def _dense_references(rank: int, size: int, summable: bool) -> tuple[int, int]:
    """The meter's bytes for the same exchange with fp32 payloads, and for a dense ring
    allreduce of the same tensor: counted on the wire, independently of the stats."""
    from disttrain import collectives
    from disttrain.comm import meter, p2p
    from disttrain.compression import all_peers

    meter.reset()
    if summable:  # the same allreduce, in fp32
        collectives.all_reduce(_input(rank), ALGORITHM)
    else:  # an fp32 tensor to each peer
        for dst, src in zip(*all_peers(rank, size), strict=True):
            p2p.exchange(_input(rank), dst, torch.empty(N), src)
    same_exchange = meter.bytes_sent
    meter.reset()
    collectives.all_reduce(_input(rank), ALGORITHM)
    return same_exchange, meter.bytes_sent


def _reduce(spec: str) -> tuple[list[float], int, int, tuple[float, float], tuple[int, int]]:
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
    compressed_all_reduce(flat, c, ALGORITHM, stats=stats)
    if c.summable:
        from disttrain.collectives import get

        item = payload.data.element_size()
        claimed = get(ALGORITHM).cost(c.wire_bytes(payload), size, rank, item).bytes_sent
    else:
        claimed = (size - 1) * (c.wire_bytes(payload) + LENGTH_BYTES)
    metered = meter.bytes_sent
    ratios = (stats.payload_compression, stats.vs_dense_allreduce)
    return flat.tolist(), metered, claimed, ratios, _dense_references(rank, size, c.summable)


SPECS = ("none", "fp16", "bf16", "topk:0.01", "onebit:1.0")
#: every spec's exchange in one world of 3 ranks (1 spawn instead of 5: a spawn's start-up
#: costs more than an exchange; each resets the meter and draws its own inputs)
RUNS = SharedWorlds({spec: (3, _reduce, (spec,)) for spec in SPECS}, timeout=150)


@pytest.mark.timeout(200)  # the first case runs the shared world
@pytest.mark.parametrize("spec", SPECS)
def test_sum_matches_the_decoded_payloads_and_the_meter_matches_the_claim(spec: str) -> None:
    from disttrain.compression import parse

    results = RUNS.get(spec)
    c = parse(spec)
    decoded = [c.decompress(c.compress(_input(r))) for r in range(3)]
    expected = decoded[0] + decoded[1] + decoded[2]
    # casts are summed in their own 16-bit type by the allreduce: allow its rounding
    tol = {"fp16": 3e-3, "bf16": 3e-2}.get(spec, 1e-6)
    for values, metered, claimed, ratios, (same_exchange, ring) in results:
        torch.testing.assert_close(torch.tensor(values), expected, rtol=tol, atol=tol)
        assert metered == claimed > 0
        # each ratio against the meter's count of its dense reference
        assert ratios[0] == pytest.approx(same_exchange / metered)
        assert ratios[1] == pytest.approx(ring / metered)
    if spec.startswith("onebit"):
        # 32% of N(0,1) entries exceed 1.0: ~3 bits of gap code + 1 sign bit each,
        # so 32 / (0.32 * 4) ~ 25x fewer bytes than fp32, less the headers
        assert 20 < results[0][3][0] < 32
        # to each of 2 peers (2 S) against a ring's 4/3 S: 1.5x fewer than that
        assert results[0][3][1] == pytest.approx(results[0][3][0] / 1.5, rel=0.01)
