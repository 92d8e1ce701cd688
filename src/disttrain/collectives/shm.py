"""Shared-memory allreduce and broadcast for the ranks of one host (no network at all).

As NCCL's intra-node path, DeepSpeed's CPU backend and oneCCL do it: the group maps
one segment (:mod:`shmseg`) with one slot per rank, twice (two sets, used by pieces in
turn). The tensor is cut into pieces of at most :data:`PIECE_BYTES` (the segment stays
small and a piece stays in cache between its copies); each piece into n chunks, chunk r
summed by rank r:

1. every rank copies the chunks it does not sum into its slot;                 barrier
2. rank r adds the other ranks' chunk r (their slots, in rank order) into its own
   chunk r in place, and copies that result into its slot;                     barrier
3. every rank copies the other chunks' results out of their owners' slots.

Only the owner of a chunk computes it and every rank reads that result: the sum is
bitwise equal on every rank. Two sets of slots make two barriers per piece enough: a
rank writes a set again only after everyone passed the first barrier of the piece in
between, i.e. finished reading that set. Broadcast needs one barrier per piece.

Cost: nothing crosses a network (0 bytes, 0 messages). Per rank and piece of m
elements with chunk c_r: m - c_r written in, (n-1)·c_r read and c_r written by the sum,
m - c_r read out: ``bytes_copied`` = (2m + (n-2)·c_r)·itemsize; 2S for n = 2.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain.collectives.base import (
    AlgorithmKind,
    AllReduceAlgorithm,
    Cost,
    CostTerms,
    Op,
    register,
)
from disttrain.collectives.chunks import chunk_bounds, chunk_sizes
from disttrain.collectives.costs import Path
from disttrain.collectives.shmseg import Segment
from disttrain.comm.meter import record_copy

__all__ = ["PIECE_BYTES", "Shm", "broadcast", "piece_bounds", "release"]

#: The largest piece one round moves (bytes); the segment holds n+1 of them.
PIECE_BYTES = 1 << 20


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
        seg = Segment(group, 2 * n, size)
        _local.held[key] = seg
    return seg


def release() -> None:
    """Drop this thread's segments (each group's ranks must call it alike)."""
    for seg in _local.held.values():
        seg.close()
    _local.held.clear()


def _reduce(seg: Segment, flat: torch.Tensor) -> int:
    """Sum ``flat`` over the segment's group in place; the bytes this rank copied."""
    n, r, itemsize, dtype = seg.n, seg.rank, flat.element_size(), flat.dtype
    copied = 0
    for a, b in piece_bounds(flat.numel(), itemsize):
        m = b - a
        piece = flat[a:b]
        base = n * (seg.turn % 2)  # this piece's set of slots
        seg.turn += 1
        slots = [seg.slot(base + j, dtype, m) for j in range(n)]
        bounds = chunk_bounds(m, n)
        lo, hi = bounds[r]
        mine = slots[r]
        mine[:lo].copy_(piece[:lo])
        mine[hi:].copy_(piece[hi:])
        seg.barrier()
        if hi > lo:
            own = piece[lo:hi]
            for j in range(n):
                if j != r:
                    own.add_(slots[j][lo:hi])
            mine[lo:hi].copy_(own)
        seg.barrier()
        for j, (x, y) in enumerate(bounds):
            if j != r and y > x:
                piece[x:y].copy_(slots[j][x:y])
        copied += (2 * m + (n - 2) * (hi - lo)) * itemsize
    return copied


class Shm(AllReduceAlgorithm):
    """Through a shared-memory segment: ranks of one host only, any world size and dtype."""

    name = "shm"

    def reduce_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        seg = _segment(group, flat.numel(), flat.element_size())
        # the segment is host memory: a GPU's tensor is summed through a host copy
        work = flat.cpu() if flat.is_cuda else flat
        record_copy(_reduce(seg, work))
        if work is not flat:
            flat.copy_(work)

    def cost(
        self,
        nbytes: int,
        world_size: int,
        rank: int = 0,
        itemsize: int = 1,
        op: Op = "all_reduce",
    ) -> Cost:
        n = world_size
        if n == 1 or nbytes == 0:
            return Cost(0, 0)
        copied = 0
        for a, b in piece_bounds(nbytes // itemsize, itemsize):
            m = b - a
            copied += (2 * m + (n - 2) * chunk_sizes(m, n)[rank]) * itemsize
        return Cost(0, 0, copied)


def _chain(algo: Shm, nbytes: int, n: int, itemsize: int) -> Path:
    # Two barriers per piece (α): the first piece's are where ranks arrive from their
    # own work at different times and a waiter may have gone to sleep; the later ones
    # find every rank in this loop (inner steps, which the calibration prices apart:
    # RESULTS "advise"). The busiest rank's copies (μ); the sum adds (n-1) chunks into
    # its result chunk (γ); no link is crossed (β).
    c = algo.cost(nbytes, n, 0, itemsize)  # rank 0: the largest chunks (chunk_sizes)
    bounds = piece_bounds(nbytes // itemsize, itemsize)
    chunk = sum(chunk_sizes(b - a, n)[0] for a, b in bounds)
    return Path(
        2 * len(bounds),
        0,
        (n - 1) * chunk * itemsize,
        0,
        0,
        f"2 barriers per {PIECE_BYTES >> 20} MiB piece = {2 * len(bounds)}",
        "2S + (n-2)/n·S copied through memory",
        copied_bytes=c.bytes_copied,
        inner_steps=2 * (len(bounds) - 1),
    )


def _steps(algo: Shm, n: int) -> str:
    return "2 per piece"


# table_position 5: after the seed lectures' four (compare --algorithms-table)
register(AlgorithmKind(Shm, CostTerms(_chain, _steps), one_host=True, table_position=5))


def broadcast(tensor: torch.Tensor, src: int, group: ProcessGroup | None = None) -> torch.Tensor:
    """Copy group rank ``src``'s ``tensor`` into every rank's ``tensor`` in place, through
    the segment (the source writes its slot, the others read it; one barrier per piece).
    Returns the tensor."""
    n = dist.get_world_size(group)
    if n == 1 or tensor.numel() == 0:
        return tensor
    if tensor.is_cuda:  # the segment is host memory: staged there and back
        return tensor.copy_(broadcast(tensor.cpu(), src, group))
    flat = tensor.contiguous().view(-1)
    itemsize = flat.element_size()
    seg = _segment(group, flat.numel(), itemsize)
    copied = 0
    for a, b in piece_bounds(flat.numel(), itemsize):
        slot = seg.slot(n * (seg.turn % 2) + src, flat.dtype, b - a)
        seg.turn += 1
        if seg.rank == src:
            slot.copy_(flat[a:b])
        seg.barrier()
        if seg.rank != src:
            flat[a:b].copy_(slot)
        copied += (b - a) * itemsize
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    record_copy(copied)
    return tensor
