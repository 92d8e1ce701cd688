"""The gradient reducer: fused buckets whose allreduce starts during backward (DDP's Reducer).

How a step goes, with overlap on:

    backward:  grad of the last layer ready -> hook copies it, scaled by 1/n, into its
               bucket's flat buffer and points ``p.grad`` at that slot; when a bucket's
               last gradient is in, its allreduce is launched (buckets strictly in index
               order, so every rank issues the same collectives in the same order)
    synchronize(): launch what backward did not (unused parameters get zeros), then
               wait for each bucket; the gradients already are views of the summed buffers

``native`` runs as ``torch.distributed.all_reduce(async_op=True)``; every other
registered algorithm (our point-to-point ring, tree, ...) runs on a
:class:`CommThread`, so backward is not blocked by it. Gradients stay views of
the buckets (DDP's ``gradient_as_bucket_view``): no copy back after the sum.
With overlap off, everything happens in ``synchronize()``.

``before_send``, when set, is called with each bucket just before its allreduce
is launched, on the thread that launches it: the last moment a check sees only
this rank's own gradients (``--check-finite``: a NaN is pinned on the rank that
computed it, not on whichever rank's sum it reached first).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup

from disttrain import collectives, timeline
from disttrain.collectives.checks import check_call, checks_everywhere
from disttrain.comm.commthread import CommThread
from disttrain.comm.errors import UsageError
from disttrain.comm.forming import new_group
from disttrain.comm.world import group_timeout
from disttrain.compression.base import Compressor
from disttrain.compression.casts import cast_dtype
from disttrain.compression.registry import parse
from disttrain.dataparallel.fusion import MB, FlatBucket, make_buckets

__all__ = ["Reducer", "wire_dtype"]


def wire_dtype(compression: str | Compressor | None) -> torch.dtype | None:
    """The type buckets travel in for ``compression`` (None: fp32 as computed).

    The one spelling of 16-bit gradients: a ``--compression`` spec (``none``,
    ``fp16``, ``bf16``) or its compressor object; anything but a cast is refused.
    """
    if compression is None:
        return None
    comp = parse(compression) if isinstance(compression, str) else compression
    dtype = cast_dtype(comp)
    if dtype is None:
        raise UsageError(
            f"compression {comp.spec!r}: the reducer sends fused buckets as a cast only "
            "(none, fp16, bf16)"
        )
    return None if dtype == torch.float32 else dtype


class Reducer:
    """Averages the gradients of ``params`` over ``group`` after each backward."""

    def __init__(
        self,
        params: Sequence[nn.Parameter],
        algorithm: collectives.Algorithm = "native",
        fusion_mb: float = 25.0,
        overlap: bool = True,
        group: ProcessGroup | None = None,
        compression: str | Compressor | None = None,
        world_size: int | None = None,
    ) -> None:
        #: a name (unknown: the registry's usage error) or a configured algorithm
        self.algo = collectives.resolve(algorithm)
        self.wire_dtype = wire_dtype(compression)
        if fusion_mb < 0:
            raise UsageError(f"fusion_mb must be >= 0, got {fusion_mb}")
        self.algorithm = self.algo.name
        self.overlap = overlap
        self.group = group
        self.world_size = dist.get_world_size(group) if world_size is None else world_size
        unique = list({id(p): p for p in params if p.requires_grad}.values())  # shared once
        # Reverse registration order: the order backward makes gradients ready.
        ordered: list[torch.Tensor] = list(reversed(unique))
        self.params: list[torch.Tensor] = ordered
        # One process has nothing to average: no buckets, no hooks, no cost.
        cap = int(fusion_mb * MB)
        self.buckets: list[FlatBucket] = make_buckets(ordered, cap) if self.world_size > 1 else []
        self._where: dict[int, tuple[int, int]] = {
            id(p): (b.index, i) for b in self.buckets for i, p in enumerate(b.tensors)
        }
        self.active = self.world_size > 1 and bool(self.buckets)
        self._sync_enabled = True
        #: called with each bucket before it is sent (it may raise: nothing is sent then)
        self.before_send: Callable[[FlatBucket], None] | None = None
        self._hooks: list[Any] = []
        self._thread: CommThread | None = None
        self._comm_group: ProcessGroup | None = group
        # an algorithm that starts every call itself (native; auto choosing only native)
        # runs on the backend's threads: no thread of ours, no group of its own
        if self.active and not collectives.always_starts(self.algo):
            # Collective: every rank creates the reducer, so every rank makes this group.
            ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
            self._comm_group = new_group(ranks, timeout=group_timeout())
            self._thread = CommThread()
        if self.active and overlap:
            for p in ordered:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad_ready))
        self._reset()
        # figures for the step breakdown
        self.wait_seconds = 0.0
        self.launched_in_backward = 0
        self.launched_total = 0

    # --- per-step state ---------------------------------------------------------------
    def _reset(self) -> None:
        self._marked = [[False] * len(b.tensors) for b in self.buckets]
        self._ready = [0] * len(self.buckets)
        self._next = 0
        self._pending: list[tuple[FlatBucket, Any, torch.Tensor]] = []

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate gradients locally (no communication)."""
        before, self._sync_enabled = self._sync_enabled, False
        try:
            yield
        finally:
            self._sync_enabled = before

    # --- filling buckets ----------------------------------------------------------------
    def _copy_in(self, bucket: FlatBucket, slot: int, grad: torch.Tensor | None) -> None:
        """Put ``grad / n`` into its slot and make the parameter's grad that slot."""
        view = bucket.views[slot]
        param = bucket.tensors[slot]
        if grad is None:
            view.zero_()
        elif grad.data_ptr() == view.data_ptr():
            view.div_(self.world_size)  # accumulated in place into last step's slot
        else:
            # Dividing before the sum (as DDP does) fuses the scaling into this copy.
            torch.div(grad, self.world_size, out=view)
        param.grad = view
        self._marked[bucket.index][slot] = True
        self._ready[bucket.index] += 1

    def _on_grad_ready(self, param: torch.Tensor) -> None:
        if not self._sync_enabled:
            return
        b, slot = self._where[id(param)]
        if self._marked[b][slot]:
            raise RuntimeError(
                "a gradient was produced twice before the optimizer step: run the earlier "
                "backward passes inside no_sync() (or use accumulate / backward_passes_per_step)"
            )
        self._copy_in(self.buckets[b], slot, param.grad)
        self._launch_ready(in_backward=True)

    def _launch_ready(self, in_backward: bool) -> None:
        # Strictly in bucket order: the same sequence of collectives on every rank.
        while self._next < len(self.buckets):
            bucket = self.buckets[self._next]
            if self._ready[bucket.index] < len(bucket.tensors):
                return
            self._launch(bucket)
            self.launched_in_backward += int(in_backward)
            self._next += 1

    # --- communication ------------------------------------------------------------------
    def _launch(self, bucket: FlatBucket) -> None:
        if self.before_send is not None:
            self.before_send(bucket)
        wire = self.wire_dtype
        send = bucket.buffer if wire is None else bucket.buffer.to(wire)
        self.launched_total += 1
        if self._thread is None:
            if checks_everywhere():  # --check-collectives: same call everywhere?
                check_call(f"allreduce/{self.algorithm}/{send.dtype}", send.numel(), self.group)
            work = collectives.start(self.algo, "all_reduce", send, self.group)  # metered
        else:
            algo, group = self.algo, self._comm_group
            work = self._thread.submit(lambda: algo.all_reduce(send, group))
        nbytes = send.numel() * send.element_size()
        timeline.track(
            work,
            f"allreduce bucket {bucket.index}",
            in_order=self._thread is not None,
            bucket=bucket.index,
            bytes=nbytes,
            algorithm=self.algorithm,
        )
        self._pending.append((bucket, work, send))

    def synchronize(self) -> None:
        """Finish this step's allreduces; afterwards every ``p.grad`` holds the average."""
        if not self.active:
            return
        start = time.perf_counter()
        try:
            for bucket in self.buckets[self._next :]:
                for slot, done in enumerate(self._marked[bucket.index]):
                    if not done:  # overlap off, or a parameter that took no part in the loss
                        self._copy_in(bucket, slot, bucket.tensors[slot].grad)
            self._launch_ready(in_backward=False)
            for bucket, work, send in self._pending:
                with timeline.span("wait", bucket=bucket.index):
                    work.wait()
                if send is not bucket.buffer:
                    bucket.buffer.copy_(send)
        finally:
            self._reset()
            self.wait_seconds += time.perf_counter() - start

    def abandon(self) -> None:
        """A peer failed mid-step: stop this step's communication before the group goes
        (the buckets not sent are dropped; the one on the wire ends by ``--timeout``)."""
        if self._thread is not None:
            timeout = group_timeout()
            self._thread.cancel(1.0 + (timeout.total_seconds() if timeout else 30.0))
            self._thread = None

    def close(self) -> None:
        """Remove the hooks and stop the communication thread."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        if self._thread is not None:
            self._thread.close()
            self._thread = None

    def stats(self) -> dict[str, Any]:
        """Figures for summaries and benchmarks."""
        return {
            "buckets": len(self.buckets),
            "bucket_bytes": [b.nbytes for b in self.buckets],
            "wait_seconds": round(self.wait_seconds, 6),
            "launched_in_backward": self.launched_in_backward,
            "launched_total": self.launched_total,
            # --algorithm auto: bytes of each call size -> the algorithm that ran it
            **collectives.by_size(self.algo),
        }
