"""Adasum (Maleki et al., "Scaling Distributed Training with Adaptive Summation", MLSys 2021).

For two vectors a and b::

    Adasum(a, b) = (1 - a·b / (2‖a‖²)) a + (1 - a·b / (2‖b‖²)) b

the sum when a ⟂ b, the average when a ∥ b (Adasum(a, a) = a). As in Horovod
(horovod/common/ops/adasum/adasum.h), a coefficient whose squared norm is below
sqrt(DBL_MIN) is 1: a zero vector leaves the other vector as the result. Over p = 2^k
ranks the result is the binary tree Adasum(Adasum(ranks 0..p/2-1), Adasum(ranks p/2..p-1)),
pairs (0,1), (2,3) first; it is computed as Horovod does, by vector halving, distance
doubling (VHDD). At level l, rank r and its partner r XOR 2^l hold the same segment of
their two subtrees' results; each keeps half (the lower rank the first floor(len/2)
elements) and combines it with the partner's copy of that half. The dot product and
squared norms are of the whole subtree vectors, spread over the 2^(l+1) ranks that share
r >> (l+1): one small allreduce of 3 doubles per such subgroup. Then the halves are
gathered back, distances halving. Products and norms are summed in float64; the
combination is done in float64 (float32 for float16 tensors), as Horovod.

It is not a sum, so it is not an allreduce algorithm of ``ALGORITHMS``.
"""

from __future__ import annotations

import math
import sys

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain.comm.p2p import exchange, group_rank, group_size

__all__ = ["DTYPES", "adasum_", "pair_coefficients"]

#: the dtypes Adasum reduces (Horovod's FusedAllreduce: float16, float32, float64)
DTYPES = (torch.float16, torch.float32, torch.float64)
#: a squared norm below this counts as zero: its coefficient is 1 (Horovod's threshold)
_TINY = math.sqrt(sys.float_info.min)

Span = tuple[int, int]


def pair_coefficients(dot: float, left_sq: float, right_sq: float) -> tuple[float, float]:
    """(c_left, c_right) of Adasum(left, right) = c_left·left + c_right·right, from
    left·right, ‖left‖² and ‖right‖²: c = 1 - dot / (2‖v‖²), or 1 where ‖v‖² ~ 0."""
    c_left = 1.0 - dot / left_sq * 0.5 if left_sq >= _TINY else 1.0
    c_right = 1.0 - dot / right_sq * 0.5 if right_sq >= _TINY else 1.0
    return c_left, c_right


def _halve(rank: int, p: int, n: int) -> list[tuple[int, Span, Span]]:
    """The VHDD levels of ``rank``: (partner, span kept, span given) over [0, n).

    The lower rank of a pair keeps the first floor(len/2) elements (Horovod's split), so
    both partners of a level hold the same span before it."""
    steps = []
    lo, hi, dist_ = 0, n, 1
    while dist_ < p:
        mid = lo + (hi - lo) // 2
        keep, give = ((lo, mid), (mid, hi)) if rank & dist_ == 0 else ((mid, hi), (lo, mid))
        steps.append((rank ^ dist_, keep, give))
        lo, hi = keep
        dist_ <<= 1
    return steps


def _group_sums(
    partial: torch.Tensor, rank: int, p: int, level: int, group: ProcessGroup | None
) -> torch.Tensor:
    """Sum ``partial`` (3 doubles) over the 2^(level+1) ranks sharing rank >> (level+1):
    one allreduce over the whole group, each subgroup in its own 3 slots (zeros elsewhere
    add nothing), so no subgroup has to be created."""
    shift = level + 1
    slots = torch.zeros(3 * (p >> shift), dtype=torch.float64)
    mine = 3 * (rank >> shift)
    slots[mine : mine + 3] = partial
    dist.all_reduce(slots, group=group)
    return slots[mine : mine + 3]


def _combine(mine: torch.Tensor, theirs: torch.Tensor, left: bool, sums: torch.Tensor) -> None:
    """``mine`` <- its coefficient·mine + the partner's coefficient·theirs, in place."""
    dot, left_sq, right_sq = sums.tolist()
    c_left, c_right = pair_coefficients(dot, left_sq, right_sq)
    c_mine, c_theirs = (c_left, c_right) if left else (c_right, c_left)
    work = torch.float32 if mine.dtype == torch.float16 else torch.float64
    mine.copy_(mine.to(work) * c_mine + theirs.to(work) * c_theirs)


def adasum_(tensor: torch.Tensor, group: ProcessGroup | None = None) -> torch.Tensor:
    """Replace ``tensor`` on every rank of ``group`` by the Adasum of the ranks' tensors.

    Every rank must call it with a tensor of the same shape and dtype (float16, float32
    or float64, contiguous, on the CPU); the group's size must be a power of two
    (ValueError otherwise, on every rank, before anything is sent). Returns ``tensor``.
    """
    if tensor.dtype not in DTYPES:
        raise ValueError(f"Adasum reduces float16, float32 or float64 tensors, not {tensor.dtype}")
    if not tensor.is_contiguous():
        raise ValueError("Adasum needs a contiguous tensor")
    p, rank = group_size(group), group_rank(group)
    if p & (p - 1):
        raise ValueError(f"Adasum needs a power-of-two number of ranks; the group has {p}")
    flat = tensor.view(-1)
    steps = _halve(rank, p, flat.numel())
    scratch = torch.empty(flat.numel() - flat.numel() // 2, dtype=flat.dtype)
    for level, (partner, keep, give) in enumerate(steps):
        mine, theirs = flat[keep[0] : keep[1]], scratch[: keep[1] - keep[0]]
        exchange(flat[give[0] : give[1]], partner, theirs, partner, group)
        a, b = mine.double(), theirs.double()
        left = rank & (1 << level) == 0
        # [dot, ‖left piece‖², ‖right piece‖²]: slots by side, so the sums are per subtree
        norms = [a.dot(a), b.dot(b)] if left else [b.dot(b), a.dot(a)]
        partial = torch.stack([a.dot(b), *norms])
        _combine(mine, theirs, left, _group_sums(partial, rank, p, level, group))
    for partner, keep, give in reversed(steps):  # gather: the partner's half comes back
        exchange(flat[keep[0] : keep[1]], partner, flat[give[0] : give[1]], partner, group)
    return tensor
