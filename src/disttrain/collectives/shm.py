"""Shared-memory allreduce and broadcast for the ranks of one host (no network at all).

As NCCL's intra-node path, DeepSpeed's CPU backend and oneCCL do it: the group maps
one segment (:mod:`shmseg`) with n input slots and one result slot. Per piece of
at most :data:`PIECE_BYTES` (so the segment stays small and a piece stays in cache
between the copy in and the sum):

1. every rank copies its piece into its own slot;        barrier
2. rank r sums chunk r of the piece over all n slots     (slot 0 + slot 1 + ... in rank
   order, so the result does not depend on who sums) into the result slot;  barrier
3. every rank copies the whole result out.

A rank enters the next piece's step 2 only after every rank has passed its own step 3
(the barrier of the next step 1), and overwrites its slot only after every rank has
summed it (the barrier of step 2): two barriers per piece. Every rank reads the same
result bytes, so the sum is bitwise equal on every rank.

Cost: nothing crosses a network (0 bytes, 0 messages); per rank and piece of m
elements, with chunk c_r of it: m written in, n·c_r read and c_r written by the sum,
m read out: ``bytes_copied`` = 2·S + (n+1)·Σ c_r·itemsize.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain.collectives.base import AllReduceAlgorithm, Cost, register
from disttrain.collectives.chunks import chunk_bounds, chunk_sizes
from disttrain.collectives.costs import Path
from disttrain.collectives.shmseg import Segment
from disttrain.comm.meter import record_copy

__all__ = ["PIECE_BYTES", "Shm", "broadcast", "piece_bounds", "release"]

#: The largest piece one round moves (bytes); the segment holds n+1 of them.
PIECE_BYTES = 4 << 20


def piece_bounds(numel: int, itemsize: int) -> list[tuple[int, int]]:
    """The pieces of a flat tensor: consecutive runs of at most PIECE_BYTES."""
    per = max(1, PIECE_BYTES // itemsize)
    return [(a, min(a + per, numel)) for a in range(0, numel, per)]


class _Segments(threading.local):
    """This thread's segment per group: the comm thread and the main thread each have theirs
    (set up collectively, in call order, like any collective on the group)."""

    def __init__(self) -> None:
        self.held: dict[Any, Segment] = {}


_local = _Segments()


def _segment(group: ProcessGroup | None, numel: int, itemsize: int) -> Segment:
    """This thread's segment for ``group`` with slots large enough for one piece."""
    n = dist.get_world_size(group)
    need = min(numel, max(1, PIECE_BYTES // itemsize)) * itemsize
    key = group if group is not None else dist.GroupMember.WORLD
    seg = _local.held.get(key)
    if seg is None or seg.slot_bytes < need:  # every rank decides alike: same numel
        if seg is not None:
            seg.close()
        size = PIECE_BYTES if need > PIECE_BYTES // 4 else need  # grow once, not per size
        seg = Segment(group, n + 1, size)
        _local.held[key] = seg
    return seg


def release() -> None:
    """Drop this thread's segments (each group's ranks must call it alike)."""
    for seg in _local.held.values():
        seg.close()
    _local.held.clear()


def _reduce(seg: Segment, flat: torch.Tensor) -> int:
    """Sum ``flat`` over the segment's group in place; the bytes this rank copied."""
    n, r, itemsize = seg.n, seg.rank, flat.element_size()
    copied = 0
    for a, b in piece_bounds(flat.numel(), itemsize):
        m = b - a
        seg.slot(r, flat.dtype, m).copy_(flat[a:b])
        seg.barrier()
        lo, hi = chunk_bounds(m, n)[r]
        if hi > lo:
            out = seg.slot(n, flat.dtype, m)[lo:hi]
            torch.add(seg.slot(0, flat.dtype, m)[lo:hi], seg.slot(1, flat.dtype, m)[lo:hi],
                      out=out)  # fmt: skip
            for j in range(2, n):
                out.add_(seg.slot(j, flat.dtype, m)[lo:hi])
        seg.barrier()
        flat[a:b].copy_(seg.slot(n, flat.dtype, m))
        copied += (2 * m + (n + 1) * (hi - lo)) * itemsize
    return copied


@register
class Shm(AllReduceAlgorithm):
    """Through a shared-memory segment: ranks of one host only, any world size and dtype."""

    name = "shm"

    def reduce_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        seg = _segment(group, flat.numel(), flat.element_size())
        record_copy(_reduce(seg, flat))

    def cost(self, nbytes: int, world_size: int, rank: int = 0, itemsize: int = 1) -> Cost:
        n = world_size
        if n == 1 or nbytes == 0:
            return Cost(0, 0)
        copied = 0
        for a, b in piece_bounds(nbytes // itemsize, itemsize):
            m = b - a
            copied += (2 * m + (n + 1) * chunk_sizes(m, n)[rank]) * itemsize
        return Cost(0, 0, copied)

    def chain(self, nbytes: int, n: int, itemsize: int) -> Path:
        # Two barriers per piece (each a wake-up: α); the busiest rank's copies (μ);
        # the sum adds (n-1) chunks into its result chunk (γ); no link is crossed (β).
        pieces = len(piece_bounds(nbytes // itemsize, itemsize))
        most = max(range(n), key=lambda r: self.cost(nbytes, n, r, itemsize).bytes_copied)
        c = self.cost(nbytes, n, most, itemsize)
        chunk = sum(chunk_sizes(b - a, n)[most] for a, b in piece_bounds(nbytes // itemsize,
                                                                          itemsize))  # fmt: skip
        return Path(
            2 * pieces, 0, (n - 1) * chunk * itemsize, 0, 0,
            f"2 barriers per {PIECE_BYTES >> 20} MiB piece = {2 * pieces}",
            "2S + (n+1)/n·S copied through memory", copied_bytes=c.bytes_copied,
        )  # fmt: skip

    def steps_formula(self, n: int) -> str:
        return "2 per piece"


def broadcast(tensor: torch.Tensor, src: int, group: ProcessGroup | None = None) -> torch.Tensor:
    """Copy group rank ``src``'s ``tensor`` into every rank's ``tensor`` in place, through
    the segment (the source writes its own slot, the others read it). Returns the tensor."""
    n = dist.get_world_size(group)
    if n == 1 or tensor.numel() == 0:
        return tensor
    flat = tensor.contiguous().view(-1)
    itemsize = flat.element_size()
    seg = _segment(group, flat.numel(), itemsize)
    rank, copied = seg.rank, 0
    for a, b in piece_bounds(flat.numel(), itemsize):
        # The source's slot was last read before the previous call's second barrier.
        if rank == src:
            seg.slot(src, flat.dtype, b - a).copy_(flat[a:b])
        seg.barrier()
        if rank != src:
            flat[a:b].copy_(seg.slot(src, flat.dtype, b - a))
        seg.barrier()
        copied += (b - a) * itemsize
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    record_copy(copied)
    return tensor
