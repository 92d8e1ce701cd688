"""Any registered allreduce algorithm, or any compressor, as a PyTorch DDP communication hook.

    from disttrain.dataparallel.ddp_hooks import AlgorithmHook
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(AlgorithmHook("ring"), allreduce_hook)

DDP hands each of its buckets to ``allreduce_hook(state, bucket)`` and expects a
Future of the averaged flat gradient. ``native`` returns the backend's own
async allreduce; our point-to-point algorithms run on the hook state's
:class:`CommThread` (its own process group), so DDP's backward keeps going
while they send, and DDP waits on the Futures at the end of backward.

    state = CompressorHook("powersgd:2")          # or a factory: lambda: PowerSGD(2, ...)
    ddp.register_comm_hook(state, compressed_hook)

runs ``compressed_all_reduce`` on each bucket (one compressor and one error-feedback
residual per bucket, the bucket's parameter shapes bound to it: PowerSGD works per
layer), synchronously, leaving the mean over the workers in the bucket: torch's
``powerSGD_hook`` in disttrain's compressor form, over any allreduce algorithm.
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations at run time.
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain import collectives
from disttrain.comm.commthread import CommThread
from disttrain.comm.forming import new_group
from disttrain.comm.world import group_timeout
from disttrain.compression.base import Compressor, LayerAware
from disttrain.compression.error_feedback import ErrorFeedback
from disttrain.compression.exchange import CompressionStats, compressed_all_reduce
from disttrain.compression.registry import parse

__all__ = ["AlgorithmHook", "CompressorHook", "allreduce_hook", "compressed_hook", "register"]


class AlgorithmHook:
    """The hook's state: which algorithm, over which group, on which thread.

    Create it on every rank (it makes a process group, a collective call).
    """

    def __init__(
        self, algorithm: str = "native", process_group: ProcessGroup | None = None
    ) -> None:
        algo = collectives.get(algorithm)  # an unknown name: the registry's usage error
        self.algorithm = algorithm
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.thread: CommThread | None = None
        self.comm_group: ProcessGroup | None = process_group
        # an algorithm whose calls all start on the backend's threads needs none of ours
        if not collectives.always_starts(algo) and self.world_size > 1:
            ranks = dist.get_process_group_ranks(process_group or dist.group.WORLD)
            self.comm_group = new_group(ranks, timeout=group_timeout())
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
    algo = collectives.get(state.algorithm)
    if state.thread is None:
        work = collectives.start(algo, "all_reduce", buffer, state.process_group)  # metered
        if work is None:  # nothing to send (one rank)
            done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            done.set_result(buffer)
            return done
        return work.get_future().then(lambda _: buffer)
    group = state.comm_group
    return state.thread.submit(lambda: algo.all_reduce(buffer, group))


def register(ddp: torch.nn.parallel.DistributedDataParallel, algorithm: str) -> AlgorithmHook:
    """Make ``ddp`` average its gradients with ``algorithm``; return the hook state."""
    state = AlgorithmHook(algorithm, ddp.process_group)
    ddp.register_comm_hook(state, allreduce_hook)
    return state


class CompressorHook:
    """The state of :func:`compressed_hook`: a compressor and a residual per DDP bucket."""

    def __init__(
        self,
        compression: "str | Callable[[], Compressor]",
        algorithm: str = "native",
        process_group: ProcessGroup | None = None,
        error_feedback: bool = True,
    ) -> None:
        collectives.get(algorithm)
        if isinstance(compression, str):
            parse(compression)  # a bad spec: the usage error now, not in backward
            spec = compression
            self.factory: Callable[[], Compressor] = lambda: parse(spec)
        else:
            self.factory = compression
        self.algorithm = algorithm
        self.process_group = process_group
        self.error_feedback = error_feedback
        self.world_size = dist.get_world_size(process_group)
        self.buckets: dict[int, tuple[Compressor, ErrorFeedback]] = {}
        self.stats = CompressionStats()

    def __getstate__(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm}

    def for_bucket(self, bucket: dist.GradBucket) -> tuple[Compressor, ErrorFeedback]:
        index = bucket.index()
        if index not in self.buckets:
            compressor = self.factory()
            self.buckets[index] = (compressor, ErrorFeedback(compressor, self.error_feedback))
        compressor, feedback = self.buckets[index]
        if isinstance(compressor, LayerAware):  # per-layer compressors (low rank)
            compressor.bind_shapes([g.shape for g in bucket.gradients()])
        return compressor, feedback


def compressed_hook(
    state: CompressorHook, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Average DDP's ``bucket`` through ``state``'s compressor (synchronously)."""
    buffer = bucket.buffer()
    compressor, feedback = state.for_bucket(bucket)
    compressed_all_reduce(
        buffer,
        compressor,
        state.algorithm,
        state.process_group,
        feedback,
        state.stats,
        mean=True,
    )
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buffer)
    return fut
