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


def _star_post() -> tuple[list[list[float]], int, int, dict[int, int]]:
    import torch.distributed as dist

    from disttrain.comm import meter, p2p

    meter.reset()
    rank, size = dist.get_rank(), dist.get_world_size()
    got = []
    if rank == 0:
        bufs = [torch.empty(3) for _ in range(1, size)]
        p2p.post([], [(b, peer) for peer, b in enumerate(bufs, start=1)])
        got = [b.tolist() for b in bufs]
        p2p.post([(torch.full((3,), 9.0), peer) for peer in range(1, size)], [])
    else:
        p2p.post([(torch.full((3,), float(rank)), 0), (torch.empty(0), 0)], [])
        back = torch.empty(3)
        p2p.post([], [(back, 0)])
        got = [back.tolist()]
    return got, meter.bytes_sent, meter.messages_sent, meter.snapshot().per_peer_bytes


def test_post_sends_and_receives_many_at_once_skipping_empty_tensors() -> None:
    results = run_world(_star_post, 3)
    got, nbytes, messages, per_peer = results[0]
    assert got == [[1.0] * 3, [2.0] * 3]
    assert (nbytes, messages, per_peer) == (24, 2, {1: 12, 2: 12})
    for rank in (1, 2):
        got, nbytes, messages, per_peer = results[rank]
        assert got == [[9.0] * 3]
        assert (nbytes, messages, per_peer) == (12, 1, {0: 12})


def _every_algorithm_through_host_copies() -> dict[str, float]:
    """Each point-to-point algorithm with every message staged through a host copy, as
    ``--backend gloo`` does for a GPU's tensors (here forced on CPU tensors)."""
    import torch.distributed as dist

    from disttrain import collectives
    from disttrain.comm import p2p

    p2p.staged = lambda tensor, group=None: True  # type: ignore[assignment]
    rank, size = dist.get_rank(), dist.get_world_size()
    worst = {}
    for name in collectives.ALGORITHMS.names():
        if name in ("native", "shm", "hierarchical"):
            continue  # no point-to-point messages of their own
        x = torch.arange(1001, dtype=torch.float32) * (rank + 1)
        collectives.all_reduce(x, name)
        want = torch.arange(1001, dtype=torch.float32) * sum(range(1, size + 1))
        worst[name] = float((x - want).abs().max())
    return worst


def test_messages_staged_through_the_host_give_the_same_sums() -> None:
    # what --backend gloo does to a GPU's tensors (gloo has no CUDA send/recv): a send goes
    # from a host copy, a receive lands in one and is copied into the tensor on wait()
    for worst in run_world(_every_algorithm_through_host_copies, 3):
        assert len(worst) >= 6 and all(v == 0.0 for v in worst.values()), worst
