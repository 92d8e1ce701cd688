"""The shared-memory allreduce and broadcast on real process groups, against gloo's own.

Checked on sub-groups of 1..6 ranks, five dtypes and awkward lengths, with pieces
of a few bytes (every tensor is cut into many pieces of unequal chunks) and of the
default size: integer-valued data equals ``dist.all_reduce`` exactly; random data is
within float tolerance of it and bitwise equal on every rank; the meter's copied
bytes equal ``cost()`` and nothing is sent; the segment's file mode is 0600; a rank
killed with SIGKILL makes its peers fail at once (not at the timeout), naming it,
and no segment is left in /dev/shm.
"""

from __future__ import annotations

import hashlib
import os
import signal
import uuid
from typing import Any

import pytest
import torch

from tests.harness import RankError, run_world

LENGTHS = [1, 2, 3, 7, 1001]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64]


def _digest(x: torch.Tensor) -> str:
    return hashlib.sha1(x.view(torch.uint8).numpy().tobytes()).hexdigest()


def _body(piece: int, sizes: list[int]) -> list[Any]:
    import torch.distributed as dist

    from disttrain import collectives
    from disttrain.collectives import shm
    from disttrain.comm import forming, meter, world

    shm.PIECE_BYTES = piece
    collectives.set_length_check(False)
    algo = collectives.get("shm")
    me = dist.get_rank()
    seen: list[Any] = []
    for k in sizes:
        group = forming.new_group(list(range(k)), timeout=world.group_timeout())
        if me >= k:
            continue
        for dtype in DTYPES:
            for length in LENGTHS:
                gen = torch.Generator().manual_seed(length * 31 + me)
                x = torch.randint(-9, 10, (length,), generator=gen).to(dtype)
                expected = x.clone()
                dist.all_reduce(expected, group=group)
                meter.reset()
                algo.all_reduce(x, group)
                assert torch.equal(x, expected), f"k={k} {dtype} length {length}"
                cost = algo.cost(length * x.element_size(), k, me, x.element_size())
                assert meter.bytes_copied == (cost.bytes_copied if k > 1 else 0)
                assert (meter.bytes_sent, meter.messages_sent, cost.bytes_sent) == (0, 0, 0)
                if dtype.is_floating_point:  # random values: gloo sums in another order
                    y = torch.randn(length, generator=gen).to(dtype)
                    ref = y.clone()
                    dist.all_reduce(ref, group=group)
                    algo.all_reduce(y, group)
                    # half precision rounds each partial sum: a few ulps of the largest term
                    tol = 6e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-5
                    torch.testing.assert_close(y, ref, rtol=tol, atol=tol)
                    seen.append((k, str(dtype), length, _digest(y)))
                z = torch.arange(length, dtype=dtype) * (me + 1)
                src = k - 1
                shm.broadcast(z, src, group)
                assert torch.equal(z, torch.arange(length, dtype=dtype) * (src + 1))
        if k > 1:
            from disttrain.collectives.shm import _local

            seg = _local.held[group]
            seen.append(("mode", k, seg.file_mode))
    # 4 MiB pieces on the whole world: 2.5 pieces of float32, then float64
    shm.PIECE_BYTES = 4 << 20
    for dtype in (torch.float32, torch.float64):
        x = torch.randint(-9, 10, (2_621_443,), generator=torch.Generator().manual_seed(me))
        x = x.to(dtype)
        expected = x.clone()
        dist.all_reduce(expected)
        algo.all_reduce(x)
        assert torch.equal(x, expected), dtype
    return seen


def test_shm_matches_gloo_on_every_group_size_bitwise_on_every_rank() -> None:
    n = 6
    sizes = list(range(1, n + 1))
    # ranks outside a group wait for it at the next new_group: a long collective timeout
    results = run_world(_body, n, args=(24, sizes), timeout=600, collective_timeout=300)
    for k in sizes:  # each of the group's ranks holds the same bytes
        mine = [[s for s in r if s[0] == k] for r in results[:k]]
        assert all(m == mine[0] for m in mine), k
    modes = {s[2] for r in results for s in r if s[0] == "mode"}
    assert modes == {0o600}


def test_cost_counts_every_copy() -> None:
    from disttrain import collectives

    algo = collectives.get("shm")
    # 10 float32 on 3 ranks, one piece: 2·40 bytes + (3-2)·chunk (4, 3, 3 elements)·4
    assert [algo.cost(40, 3, r, 4).bytes_copied for r in range(3)] == [96, 92, 92]
    assert algo.cost(40, 2, 1, 4).bytes_copied == 80
    assert algo.cost(40, 1, 0, 4).bytes_copied == 0
    from disttrain.collectives.paths import path_of

    path = path_of(algo, 64 << 20, 2, 4)
    copied = algo.cost(64 << 20, 2, 0, 4).bytes_copied
    assert path.critical_bytes == 0 and path.copied_bytes == copied


def _killed(victim: int) -> None:
    import torch.distributed as dist

    from disttrain import collectives

    collectives.set_length_check(False)  # so that the peers wait in the shm barrier itself
    x = torch.ones(100_000)
    for step in range(50):
        if step == 3 and dist.get_rank() == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        collectives.all_reduce(x, "shm")


@pytest.mark.parametrize("victim", [0, 1, 2])
def test_kill_9_of_any_rank_fails_its_peers_at_once_and_leaves_no_segment(victim: int) -> None:
    tag = f"t{uuid.uuid4().hex[:8]}"
    with pytest.raises(RankError) as err:
        run_world(
            _killed,
            3,
            args=(victim,),
            timeout=120,
            collective_timeout=60,
            env={"DISTTRAIN_JOB_TAG": tag},
        )
    text = str(err.value)
    assert f"rank {victim} died without a result (signal SIGKILL)" in text, text
    # the peers stopped on the dead pid, long before the 60 s collective timeout
    assert "died during a shared-memory collective" in text, text
    assert not [f for f in os.listdir("/dev/shm") if tag in f]


def test_launcher_removes_what_a_dead_rank_left() -> None:
    from disttrain.collectives.shmseg import PREFIX, SHM_DIR, remove_leftovers

    tag = f"t{uuid.uuid4().hex[:8]}"
    path = os.path.join(SHM_DIR, f"{PREFIX}{tag}-123-abc")
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
    other = os.path.join(SHM_DIR, f"{PREFIX}{tag}x-1-a")  # another job's: kept
    os.close(os.open(other, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
    try:
        assert remove_leftovers(tag) == [os.path.basename(path)]
        assert not os.path.exists(path) and os.path.exists(other)
    finally:
        os.unlink(other)


def _waits() -> tuple[float, float]:
    import time

    import torch.distributed as dist

    from disttrain import collectives

    collectives.set_length_check(False)  # so that rank 0 waits in the shm barrier itself
    x = torch.ones(10)
    collectives.all_reduce(x, "shm")  # the segment is set up
    if dist.get_rank() == 1:
        time.sleep(1.5)
    cpu, wall = time.process_time(), time.perf_counter()
    collectives.all_reduce(x, "shm")
    return time.process_time() - cpu, time.perf_counter() - wall


def test_a_rank_waiting_for_a_late_peer_sleeps_instead_of_spinning() -> None:
    cpu, wall = run_world(_waits, 2, timeout=120)[0]
    # a busy-spin would burn about the whole wait; the futex sleep burns next to nothing
    # (bounds on CPU time, not on speed: a loaded machine only makes the wait longer)
    assert wall > 1.0 and cpu < 0.1 * wall, (cpu, wall)
