"""The cross-rank call check: an error naming the ranks, instead of a hang, a crash or wrong sums.

gloo's point-to-point transport accepts a message shorter than the posted
receive buffer without a word (the tail keeps stale data) and aborts the process
on a longer one; a rank that enters a different collective than its peers (a
broadcast while they allreduce, another algorithm, another dtype) waits until
the timeout or corrupts the others' data. So before any data moves, every rank
states *what* it is calling and *how long* the message is: one native allreduce
(MAX) of ``[op, numel, -op, -numel]`` gives every rank the largest and the
smallest operation code and length at once. ``op`` is a CRC-32 of the
operation's name (``allreduce/ring/torch.float32``, ``broadcast/...``). Only when
they differ is a second collective (all_gather) spent to name who called what.
The check works when every rank runs it (the debug mode ``--check-collectives``
turns it on everywhere): the check itself has the same shape on every rank.
"""

from __future__ import annotations

import zlib

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain.comm.errors import CollectiveMismatch
from disttrain.comm.meter import record_send
from disttrain.comm.p2p import global_rank

__all__ = [
    "CHECK_BYTES",
    "add_operation",
    "check_call",
    "check_cost_bytes",
    "check_lengths",
    "checks_everywhere",
    "op_code",
    "set_checks_everywhere",
]

#: The payload of the check: four int64 values.
CHECK_BYTES = 32

_NAMES: dict[int, str] = {}
#: Operation families (``broadcast``, ``allreduce/ring``, ...), each checked per dtype.
_FAMILIES: list[str] = ["broadcast"]
#: ``--check-collectives``: also check broadcasts and native buckets (process-wide).
_everywhere = False


def set_checks_everywhere(enabled: bool) -> bool:
    """Also check broadcasts and native async buckets (``--check-collectives``); old value.

    Off by default, unlike the algorithms' own length check: these sites are the
    library's hot paths (parameter broadcast, DDP-style buckets) and the check
    blocks on a collective of its own.
    """
    global _everywhere
    old, _everywhere = _everywhere, enabled
    return old


def checks_everywhere() -> bool:
    return _everywhere


def op_code(name: str) -> int:
    """A positive 31-bit code for the operation ``name`` (remembered, to name it back)."""
    code = zlib.crc32(name.encode()) & 0x7FFFFFFF
    _NAMES[code] = name
    return code


def add_operation(family: str) -> None:
    """Name an operation family (``allreduce/ring``) that ranks may call, to name it back.

    A rank that receives another rank's code can only name it if it computed the same
    code itself: every registered algorithm adds its family here when it is registered
    (:func:`disttrain.collectives.base.register`), so this module needs no registry.
    """
    if family not in _FAMILIES:
        _FAMILIES.append(family)


def _learn_names() -> None:
    """Remember the codes of the calls other ranks may have made (to name them back)."""
    dtypes = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32)
    for family in _FAMILIES:
        for dtype in dtypes:
            op_code(f"{family}/{dtype}")


def check_cost_bytes(world_size: int) -> tuple[int, int]:
    """Bytes and messages the check adds per rank (gloo's ring estimate: 2(n-1)/n·32)."""
    if world_size == 1:
        return 0, 0
    return 2 * (world_size - 1) * CHECK_BYTES // world_size, 2 * (world_size - 1)


def check_call(op: str, numel: int, group: ProcessGroup | None = None) -> None:
    """Raise :class:`CollectiveMismatch` on every rank unless all call ``op`` on ``numel``."""
    n = dist.get_world_size(group)
    if n == 1:
        return
    code = op_code(op)
    bounds = torch.tensor([code, numel, -code, -numel], dtype=torch.int64)
    dist.all_reduce(bounds, op=dist.ReduceOp.MAX, group=group)
    rank = dist.get_rank(group)
    nbytes, messages = check_cost_bytes(n)
    record_send(global_rank(group, (rank + 1) % n), nbytes, messages, True)
    if int(bounds[0]) == -int(bounds[2]) and int(bounds[1]) == -int(bounds[3]):
        return
    calls = [torch.zeros(2, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(calls, torch.tensor([code, numel], dtype=torch.int64), group=group)
    if int(bounds[0]) == -int(bounds[2]):  # the same operation, different lengths
        described = ", ".join(
            f"rank {global_rank(group, r)}: {int(t[1])}" for r, t in enumerate(calls)
        )
        raise CollectiveMismatch(f"{op} called with different lengths ({described})")
    _learn_names()
    described = ", ".join(
        f"rank {global_rank(group, r)}: {_NAMES.get(int(t[0]), f'operation #{int(t[0])}')} "
        f"of {int(t[1])} elements"
        for r, t in enumerate(calls)
    )
    raise CollectiveMismatch(f"ranks called different collectives ({described})")


def check_lengths(numel: int, group: ProcessGroup | None = None, op: str = "allreduce") -> None:
    """:func:`check_call` for ``op`` (kept for callers that check lengths only)."""
    check_call(op, numel, group)
