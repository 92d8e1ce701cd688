"""Posting the receive with the send matters: irecv+isend vs isend then a blocking recv.

    PYTHONPATH=src python benchmarks/p2p_posting.py

Two ranks (gloo over loopback) swap a message of each size, 50 times per
mode after 5 warm-ups; the median of the slower rank's time per swap is
reported, and the ratio blocking/posted. "posted" is what comm.p2p.exchange
does: post irecv, then isend, then wait on both. "blocking" posts isend, then
calls recv, then waits on the send.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20]
ITERS, WARMUP = 50, 5


def _swap(mode: str, out: torch.Tensor, into: torch.Tensor, peer: int) -> None:
    if mode == "posted":
        works = [dist.irecv(into, src=peer), dist.isend(out, dst=peer)]
        for w in works:
            w.wait()
    else:
        send = dist.isend(out, dst=peer)
        dist.recv(into, src=peer)
        send.wait()


def _rank(rank: int, store: str) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    peer = 1 - rank
    for nbytes in SIZES:
        medians = {}
        for mode in ("posted", "blocking", "posted", "blocking"):  # interleaved, twice
            out, into = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
            times = torch.zeros(ITERS, dtype=torch.float64)
            for i in range(WARMUP + ITERS):
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
    dist.destroy_process_group()


if __name__ == "__main__":
    folder = tempfile.mkdtemp()
    mp.spawn(_rank, args=(os.path.join(folder, "store"),), nprocs=2)
