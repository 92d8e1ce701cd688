"""Any registered allreduce algorithm as a PyTorch DDP communication hook.

    from disttrain.dataparallel.ddp_hooks import AlgorithmHook
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(AlgorithmHook("ring"), allreduce_hook)

DDP hands each of its buckets to ``allreduce_hook(state, bucket)`` and expects a
Future of the averaged flat gradient. ``native`` returns the backend's own
async allreduce; our point-to-point algorithms run on the hook state's
:class:`CommThread` (its own process group), so DDP's backward keeps going
while they send, and DDP waits on the Futures at the end of backward.
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations at run time.
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain import collectives
from disttrain.comm.world import group_timeout
from disttrain.dataparallel.commthread import CommThread

__all__ = ["AlgorithmHook", "allreduce_hook", "register"]


class AlgorithmHook:
    """The hook's state: which algorithm, over which group, on which thread.

    Create it on every rank (it makes a process group, a collective call).
    """

    def __init__(
        self, algorithm: str = "native", process_group: ProcessGroup | None = None
    ) -> None:
        collectives.get(algorithm)  # an unknown name: the registry's usage error
        self.algorithm = algorithm
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.thread: CommThread | None = None
        self.comm_group: ProcessGroup | None = process_group
        if algorithm != "native" and self.world_size > 1:
            ranks = dist.get_process_group_ranks(process_group or dist.group.WORLD)
            self.comm_group = dist.new_group(ranks, timeout=group_timeout())
            self.thread = CommThread("disttrain-ddp-hook")
        self.buckets = 0

    def __getstate__(self) -> dict[str, Any]:
        # DDP may pickle its hook state with the model; groups and threads never travel.
        return {"algorithm": self.algorithm}

    def close(self) -> None:
        if self.thread is not None:
            self.thread.close()


def allreduce_hook(
    state: AlgorithmHook, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Average DDP's flat ``bucket`` over the group with ``state.algorithm``."""
    buffer = bucket.buffer()
    buffer.div_(state.world_size)  # as DDP's default hook: divide, then sum
    state.buckets += 1
    if state.thread is None:
        work = dist.all_reduce(buffer, group=state.process_group, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])
    algo = collectives.get(state.algorithm)
    group = state.comm_group
    return state.thread.submit(lambda: algo.all_reduce(buffer, group))


def register(ddp: torch.nn.parallel.DistributedDataParallel, algorithm: str) -> AlgorithmHook:
    """Make ``ddp`` average its gradients with ``algorithm``; return the hook state."""
    state = AlgorithmHook(algorithm, ddp.process_group)
    ddp.register_comm_hook(state, allreduce_hook)
    return state
