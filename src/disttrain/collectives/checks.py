"""The cross-rank length check: an error naming the ranks, instead of a crash or wrong sums.

gloo's point-to-point transport accepts a message shorter than the posted
receive buffer without a word (the tail keeps stale data) and aborts the process
on a longer one, so ranks that disagree on the length must be caught before any
data moves. One native allreduce (MAX) of ``[numel, -numel]`` gives every rank
the largest and the smallest length at once; only when they differ is a second
collective (all_gather) spent to name who passed what.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain.comm.errors import CollectiveMismatch
from disttrain.comm.meter import record_send
from disttrain.comm.p2p import global_rank

__all__ = ["CHECK_BYTES", "check_cost_bytes", "check_lengths"]

#: The payload of the check: two int64 values.
CHECK_BYTES = 16


def check_cost_bytes(world_size: int) -> tuple[int, int]:
    """Bytes and messages the check adds per rank (gloo's ring estimate: 2(n-1)/n·16)."""
    if world_size == 1:
        return 0, 0
    return 2 * (world_size - 1) * CHECK_BYTES // world_size, 2 * (world_size - 1)


def check_lengths(numel: int, group: ProcessGroup | None = None) -> None:
    """Raise :class:`CollectiveMismatch` on every rank unless all pass ``numel`` elements."""
    n = dist.get_world_size(group)
    if n == 1:
        return
    bounds = torch.tensor([numel, -numel], dtype=torch.int64)
    dist.all_reduce(bounds, op=dist.ReduceOp.MAX, group=group)
    rank = dist.get_rank(group)
    nbytes, messages = check_cost_bytes(n)
    record_send(global_rank(group, (rank + 1) % n), nbytes, messages, True)
    if int(bounds[0]) == -int(bounds[1]):
        return
    lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(lengths, torch.tensor([numel], dtype=torch.int64), group=group)
    described = ", ".join(f"rank {global_rank(group, r)}: {int(t)}" for r, t in enumerate(lengths))
    raise CollectiveMismatch(f"allreduce called with different lengths ({described})")
