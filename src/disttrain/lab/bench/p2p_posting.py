"""Does posting the receive with the send matter: irecv+isend vs isend then a blocking recv.

    disttrain bench p2p-posting [--iters 50]

Two ranks (gloo over loopback) swap a message of each size, 50 times per
mode (``--iters``) after 5 warm-ups, the modes interleaved twice; the better
of each mode's two medians of the slower rank's time per swap is reported,
and the ratio blocking/posted. "posted" is what comm.p2p.exchange
does: post irecv, then isend, then wait on both. "blocking" posts isend, then
calls recv, then waits on the send.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from disttrain.comm.errors import UsageError

__all__ = ["add_arguments", "run"]

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20]
WARMUP = 5


def _swap(mode: str, out: Any, into: Any, peer: int) -> None:
    import torch.distributed as dist

    if mode == "posted":
        works = [dist.irecv(into, src=peer), dist.isend(out, dst=peer)]
        for w in works:
            assert w is not None  # None only for a rank outside the group
            w.wait()
    else:
        send = dist.isend(out, dst=peer)
        dist.recv(into, src=peer)
        assert send is not None
        send.wait()


def _rank(iters: int) -> None:
    """One rank of the 2-rank world :func:`disttrain.launch.spawn.run_world` formed."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    peer = 1 - rank
    for nbytes in SIZES:
        medians: dict[str, list[float]] = {}
        for mode in ("posted", "blocking", "posted", "blocking"):  # interleaved, twice
            out, into = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
            times = torch.zeros(iters, dtype=torch.float64)
            for i in range(WARMUP + iters):
                dist.barrier()
                start = time.perf_counter()
                _swap(mode, out, into, peer)
                if i >= WARMUP:
                    times[i - WARMUP] = time.perf_counter() - start
            dist.all_reduce(times, op=dist.ReduceOp.MAX)
            medians.setdefault(mode, []).append(statistics.median(times.tolist()))
        if rank == 0:
            posted, blocking = min(medians["posted"]), min(medians["blocking"])
            print(
                f"{nbytes >> 10:>6} KB  posted {posted * 1e6:8.0f} us  "
                f"blocking {blocking * 1e6:8.0f} us  blocking/posted {blocking / posted:5.2f}"
            )
            sys.stdout.flush()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--iters", type=int, default=50, help="timed swaps per mode (default: 50)")


def run(args: argparse.Namespace) -> int:
    from disttrain.launch.spawn import run_world

    if args.iters < 1:
        raise UsageError(f"--iters {args.iters}: use at least 1")
    run_world(_rank, 2, args=(args.iters,), timeout=None)  # gloo over loopback, 1 thread
    return 0
