"""Metered point-to-point exchange on a real process group."""

from __future__ import annotations

import torch

from tests.harness import run_world


def _ring_shift(n: int) -> tuple[list[float], int, int]:
    import torch.distributed as dist

    from disttrain.comm import meter, p2p

    meter.reset()
    rank, size = dist.get_rank(), dist.get_world_size()
    out = torch.empty(n)
    p2p.exchange(torch.full((n,), float(rank)), (rank + 1) % size, out, (rank - 1) % size)
    return out.tolist(), meter.bytes_sent, meter.messages_sent


def test_exchange_shifts_around_a_ring_and_meters_each_send() -> None:
    results = run_world(_ring_shift, 3, args=(5,))
    for rank, (values, nbytes, messages) in enumerate(results):
        assert values == [float((rank - 1) % 3)] * 5
        assert (nbytes, messages) == (5 * 4, 1)
