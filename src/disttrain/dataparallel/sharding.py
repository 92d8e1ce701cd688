"""The flat shard layout of sharded data parallelism (ZeRO) and its gradient reducer.

Parameters are packed into flat groups (fusion buckets for stages 1 and 2, one
group per layer for stage 3), in the order backward makes their gradients
ready; every parameter becomes a view of its group's flat buffer. Each group is
cut into the balanced chunks of :mod:`disttrain.collectives.chunks` (sizes
differ by at most one element, so no padding): rank r owns chunk r of every
group. Its shard is one ``nn.Parameter`` per group, which the optimizer steps:

- stages 1 and 2: the shard is a view of the flat buffer itself, so the update
  lands in the model in place and an all-gather of each group finishes the step;
- stage 3: the shard is a tensor of its own, and the flat buffer exists only
  while a layer is gathered (:mod:`disttrain.dataparallel.gather`).

The reducer gives each shard its averaged gradient. Stage 1 allreduces each
group (the full gradient stays, 4Ψ bytes); stages 2 and 3 reduce-scatter it into
a transient buffer, keep this rank's chunk (4Ψ/N in all) and free the rest.
Groups are launched strictly in order as their last gradient arrives (during
backward with overlap, on a :class:`CommThread` with its own process group), as
:class:`~disttrain.dataparallel.reducer.Reducer` does for the allreduce strategy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup

from disttrain import collectives, timeline
from disttrain.collectives.checks import check_call, checks_everywhere
from disttrain.collectives.chunks import chunk_bounds
from disttrain.comm.commthread import CommThread
from disttrain.comm.forming import new_group
from disttrain.comm.world import group_timeout
from disttrain.dataparallel.fusion import FlatBucket

__all__ = [
    "MAX_INFLIGHT",
    "ShardGroup",
    "ShardLayout",
    "ShardedReducer",
    "check_layout",
    "shard_optimizer",
]

#: reduce-scatters of stages 2 and 3 queued or running at once (a third group fills meanwhile)
MAX_INFLIGHT = 2


@dataclass
class ShardGroup:
    """One flat group: its parameters (views of ``flat``), and this rank's chunk of it."""

    index: int
    params: list[nn.Parameter]
    flat: torch.Tensor
    start: int  # this rank's chunk: flat[start:stop]
    stop: int
    shard: nn.Parameter  # what the optimizer steps

    @property
    def numel(self) -> int:
        return sum(p.numel() for p in self.params)

    def offsets(self) -> Iterator[tuple[nn.Parameter, int]]:
        offset = 0
        for p in self.params:
            yield p, offset
            offset += p.numel()


class ShardLayout:
    """``groups`` of parameters packed flat and cut into ``n`` chunks; rank ``rank`` owns one.

    ``own_shards`` (stage 3): the shard is a copy, not a view of the flat buffer,
    so the buffer can be freed between uses.
    """

    def __init__(
        self, groups: Sequence[Sequence[nn.Parameter]], n: int, rank: int, own_shards: bool
    ) -> None:
        self.n, self.rank, self.own_shards = n, rank, own_shards
        self.groups: list[ShardGroup] = []
        for index, params in enumerate(groups):
            flat = torch.cat([p.detach().reshape(-1) for p in params])
            offset = 0
            for p in params:
                p.data = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
            start, stop = chunk_bounds(flat.numel(), n)[rank]
            piece = flat[start:stop]
            shard = nn.Parameter(piece.clone() if own_shards else piece)
            self.groups.append(ShardGroup(index, list(params), flat, start, stop, shard))

    @property
    def shards(self) -> list[nn.Parameter]:
        return [g.shard for g in self.groups]

    @property
    def numel(self) -> int:
        return sum(g.numel for g in self.groups)

    @property
    def shard_numel(self) -> int:
        return sum(g.stop - g.start for g in self.groups)


def check_layout(layout: ShardLayout, group: ProcessGroup | None) -> None:
    """CollectiveMismatch on every rank unless all have the same groups (collective).

    The layout's lengths are fixed for the run and every rank calls its collectives
    in group order, so the per-call length check of the algorithms
    (:func:`~disttrain.collectives.checks.check_call`, one blocking 32-byte allreduce
    each: 10 a step on the mlp's 5 groups, measured at 12 ms of the all-gather's
    40 ms under load, docs/zero.md) is done once here instead, as for the allreduce
    strategy's native buckets; ``--check-collectives`` checks every call again."""
    if not collectives.length_check_enabled():
        return
    for g in layout.groups:
        check_call(f"zero-group/{g.index}", g.numel, group)


def shard_optimizer(optimizer: torch.optim.Optimizer, shards: list[nn.Parameter]) -> None:
    """Make ``optimizer`` step ``shards`` instead of the model's parameters (state cleared).

    Right for elementwise optimizers (SGD, momentum, Adam: each element's update
    reads only that element's gradient and state), with one parameter group.
    """
    if len(optimizer.param_groups) != 1:
        raise ValueError(
            f"sharding needs an optimizer with one parameter group, got "
            f"{len(optimizer.param_groups)}"
        )
    optimizer.param_groups[0]["params"] = list(shards)
    optimizer.state.clear()


class _Launched:
    """One group's reduction in flight: a ``dist.Work`` (started by the backend) or the
    Future of a communication-thread job; ``keep`` copies this rank's chunk out of an
    asynchronous reduce-scatter's buffer once it is done (the job does it itself)."""

    def __init__(self, index: int, work: Any, keep: Callable[[], torch.Tensor] | None) -> None:
        self.index, self.work, self.keep = index, work, keep
        self.own: torch.Tensor | None = None
        self.finished = False

    def completed(self) -> bool:
        """Whether the collective has run (``finish`` then waits for nothing)."""
        if isinstance(self.work, torch.futures.Future):
            return bool(self.work.done())
        return bool(self.work.is_completed())

    def finish(self) -> torch.Tensor | None:
        """Wait; stages 2/3: this rank's averaged chunk (the buffer is let go)."""
        if not self.finished:
            with timeline.span("wait", bucket=self.index):
                self.work.wait()
            if self.keep is not None:
                self.own, self.keep = self.keep(), None  # the buffer goes with the closure
            elif isinstance(self.work, torch.futures.Future):
                self.own = self.work.value()
            self.work, self.finished = None, True  # a dist.Work holds its tensors: let go
        return self.own


class ShardedReducer:
    """Averages each group's gradients into the shards: allreduce (stage 1) or reduce-scatter."""

    def __init__(
        self,
        layout: ShardLayout,
        algorithm: collectives.Algorithm,
        overlap: bool,
        group: ProcessGroup | None,
        keep_full: bool,
    ) -> None:
        self.layout = layout
        self.algo = collectives.resolve(algorithm)
        self.algorithm = self.algo.name
        self.keep_full = keep_full
        self.n = layout.n
        groups = layout.groups
        # gradients live where the parameters do (on NCCL every collective's tensors are GPU)
        self.device = groups[0].flat.device if groups else torch.device("cpu")
        # stage 1: the full averaged gradient of each group stays (the parameters' .grad)
        self.full = [torch.zeros(g.numel, device=self.device) for g in groups] if keep_full else []
        # stages 2 and 3: only this rank's chunks stay, back to back
        self.own = torch.zeros(0 if keep_full else layout.shard_numel, device=self.device)
        self._own_at: list[int] = []
        at = 0
        for g in groups:
            self._own_at.append(at)
            at += g.stop - g.start
        self._where = {id(p): (g.index, i) for g in groups for i, p in enumerate(g.params)}
        self._offset = {id(p): off for g in groups for p, off in g.offsets()}
        ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
        self._comm_group = new_group(ranks, timeout=group_timeout())  # collective
        self._thread: CommThread | None = CommThread("disttrain-zero")
        self._hooks: list[Any] = []
        if overlap:
            for g in groups:
                for p in g.params:
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad_ready))
        self._sync_enabled = True
        #: called with each group (as a bucket of this rank's gradients) before it is sent
        self.before_send: Callable[[FlatBucket], None] | None = None
        self.wait_seconds = 0.0
        self.launched_in_backward = 0
        self.launched_total = 0
        self._reset()

    def _reset(self) -> None:
        self._buffers: list[torch.Tensor | None] = [None] * len(self.layout.groups)
        self._ready = [0] * len(self.layout.groups)
        self._marked: set[int] = set()
        self._next = 0
        self._pending: list[_Launched] = []

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate gradients locally (no communication)."""
        before, self._sync_enabled = self._sync_enabled, False
        try:
            yield
        finally:
            self._sync_enabled = before

    def _buffer(self, index: int) -> torch.Tensor:
        buf = self._buffers[index]
        if buf is None:  # stages 2/3: allocated for this step only, freed once scattered
            numel = self.layout.groups[index].numel
            buf = self.full[index] if self.keep_full else torch.empty(numel, device=self.device)
            self._buffers[index] = buf
        return buf

    def _copy_in(self, param: nn.Parameter) -> None:
        """Put ``grad / n`` into its slot (dividing before the sum, as DDP does)."""
        index, _ = self._where[id(param)]
        buf = self._buffer(index)
        offset = self._offset[id(param)]
        view = buf[offset : offset + param.numel()].view_as(param)
        if param.grad is None:
            view.zero_()  # a parameter that took no part in the loss
        else:
            torch.div(param.grad, self.n, out=view)
        # stage 1 keeps the full gradient (a view of its group); stages 2/3 drop it
        param.grad = view if self.keep_full else None
        self._marked.add(id(param))
        self._ready[index] += 1

    def _on_grad_ready(self, param: torch.Tensor) -> None:
        if not self._sync_enabled:
            return
        if id(param) in self._marked:
            raise RuntimeError(
                "a gradient was produced twice before the optimizer step: run the earlier "
                "backward passes inside no_sync() (or use --accumulate)"
            )
        assert isinstance(param, nn.Parameter)
        self._copy_in(param)
        self._launch_ready(in_backward=True)

    def _launch_ready(self, in_backward: bool) -> None:
        groups = self.layout.groups
        while self._next < len(groups) and self._ready[self._next] == len(
            groups[self._next].params
        ):
            self._launch(self._next)
            self.launched_in_backward += int(in_backward)
            self._next += 1

    def _launch(self, index: int) -> None:
        group = self.layout.groups[index]
        buf = self._buffer(index)
        if self.before_send is not None:
            views = [buf[o : o + p.numel()].view_as(p) for p, o in group.offsets()]
            self.before_send(FlatBucket(index, list(group.params), buf, views))
        comm, algo, checked = self._comm_group, self.algo, checks_everywhere()
        assert self._thread is not None
        nbytes = buf.numel() * buf.element_size()
        keep: Callable[[], torch.Tensor] | None = None  # the copy-out of an async job
        if self.keep_full:
            # native: started on gloo's own thread, as the allreduce strategy's buckets
            work = None if checked else collectives.start(algo, "all_reduce", buf, comm)
            if work is None:
                work = self._thread.submit(lambda: algo.all_reduce(buf, comm, checked))
        else:
            # The job keeps this rank's chunk and lets the group's buffer go as soon as it
            # has run: a step never holds more than the groups in flight (not 4Ψ bytes).
            at, (start, stop) = self._own_at[index], (group.start, group.stop)
            own = self.own[at : at + stop - start]
            self._bound_inflight()
            work = None if checked else collectives.start(algo, "reduce_scatter", buf, comm)
            if work is None:

                def job() -> torch.Tensor:
                    algo.reduce_scatter(buf, comm, checked)
                    return own.copy_(buf[start:stop])

                work = self._thread.submit(job)
            else:  # started: the chunk is copied out once it is done (_finish)
                keep = lambda: own.copy_(buf[start:stop])  # noqa: E731
            self._buffers[index] = None
        name = "allreduce" if self.keep_full else "reduce-scatter"
        timeline.track(
            work,
            f"{name} group {index}",
            in_order=keep is None,
            bucket=index,
            bytes=nbytes,
            algorithm=self.algorithm,
        )
        self.launched_total += 1
        self._pending.append(_Launched(index, work, keep))

    def _bound_inflight(self) -> None:
        """Wait while :data:`MAX_INFLIGHT` reduce-scatters are queued or running: each holds
        its group's whole gradient (and the collective's copy of it), so without a bound a
        backward faster than the network would hold all of them, 4Ψ bytes or more, at once."""
        for entry in self._pending:  # what has run lets its buffer go (the chunk copied out)
            if not entry.finished and entry.completed():
                entry.finish()
        waiting = [e for e in self._pending if not e.finished]
        if len(waiting) >= MAX_INFLIGHT:
            with timeline.span("wait in-flight reduce-scatter"):
                waiting[-MAX_INFLIGHT].finish()

    def synchronize(self) -> None:
        """Finish this step's reductions; afterwards every shard's ``.grad`` is its average."""
        start = time.perf_counter()
        try:
            for group in self.layout.groups[self._next :]:
                for p in group.params:
                    if id(p) not in self._marked:  # overlap off, or unused in the loss
                        self._copy_in(p)
            self._launch_ready(in_backward=False)
            for entry in self._pending:
                own = entry.finish()
                group = self.layout.groups[entry.index]
                if self.keep_full:
                    group.shard.grad = self.full[entry.index][group.start : group.stop]
                else:  # the job copied this rank's chunk into its place in self.own
                    group.shard.grad = own
        finally:
            self._reset()  # drops the transient buffers of stages 2 and 3
            self.wait_seconds += time.perf_counter() - start

    def close(self) -> None:
        """Remove the hooks and stop the communication thread."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        if self._thread is not None:
            self._thread.close()
            self._thread = None

    def stats(self) -> dict[str, Any]:
        return {
            "groups": len(self.layout.groups),
            "shard_elements": self.layout.shard_numel,
            "wait_seconds": round(self.wait_seconds, 6),
            "launched_in_backward": self.launched_in_backward,
            "launched_total": self.launched_total,
            **collectives.by_size(self.algo),  # --algorithm auto: what ran each size
        }
