"""Execute a pipeline schedule on one stage: compute the grid's actions, pass tensors on.

Each stage runs its own column of the grid in order, without waiting for the
other stages' ticks: a forward's activation is sent to s+1 and a backward's
input gradient to s-1 with ``isend`` and not waited on (the next action starts
at once; all sends are waited on at the end of the step), and the receive
that an action needs is posted one action ahead, so it is usually complete
when the action starts (GPipe), or when the action needs it (1F1B, where the
early post was measured slower: :func:`recv_ahead_default`). A stage
receives only activations from s-1 (in the forward order of s-1) and
gradients from s+1 (in its backward order), each a FIFO stream between one
pair of ranks, so both sides agree on what each message is without any
header. The grid's column order respects every dependency (it
is a simulation of the schedule), so the waits cannot form a cycle. Receive
buffers are shaped by running the whole model once on the ``meta`` device (no
memory, no compute) for each batch shape.

The loss of a micro-batch is scaled by 1/M, so the summed gradients over the
M micro-batches equal the gradient of the mean loss over the whole batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.distributed import ProcessGroup
from torch.utils.checkpoint import checkpoint

from disttrain import timeline
from disttrain.comm import p2p, phases
from disttrain.parallel.pipeline.schedule import Action, Grid

__all__ = ["ActivationMeter", "PipelineRunner", "StepTimes", "recv_ahead_default"]

COMM = phases.COMMUNICATION
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class ActivationMeter:
    """Bytes of tensors saved for backward that are alive now, and their peak.

    Parameters (and views of them) saved by layers are left out: they are not
    activations. A saved tensor is counted from its pack until autograd frees
    the graph that holds it.
    """

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.live = 0
        self.peak = 0
        self._param_ptrs = {p.untyped_storage().data_ptr() for p in params}

    def reset_peak(self) -> None:
        self.peak = self.live

    @contextmanager
    def recording(self) -> Iterator[None]:
        def pack(t: torch.Tensor) -> Any:
            if t.device.type == "meta" or t.untyped_storage().data_ptr() in self._param_ptrs:
                return t
            return _Saved(t, self)

        def unpack(saved: Any) -> torch.Tensor:
            return saved.tensor if isinstance(saved, _Saved) else saved

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield


class _Saved:
    """A saved activation that uncounts itself when autograd lets it go."""

    __slots__ = ("meter", "nbytes", "tensor")

    def __init__(self, tensor: torch.Tensor, meter: ActivationMeter) -> None:
        self.tensor = tensor
        self.meter = meter
        self.nbytes = tensor.numel() * tensor.element_size()
        meter.live += self.nbytes
        meter.peak = max(meter.peak, meter.live)

    def __del__(self) -> None:
        self.meter.live -= self.nbytes


class StepTimes:
    """Where one stage's step went: compute (busy), communication, and the whole step.

    ``start`` and ``end`` are ``time.monotonic()`` readings, one clock for every
    process of a host, so the stages' steps can be laid on one time line (the
    pipeline's step is from the first stage's start to the last stage's end).
    ``compute_cpu`` is this thread's CPU time during the compute: ``compute -
    compute_cpu`` is the time the operating system ran something else while
    this stage was computing (a loaded machine), which a peer waits for as idle.
    """

    def __init__(self) -> None:
        self.compute = 0.0
        self.compute_cpu = 0.0
        self.comm = 0.0
        self.step = 0.0
        self.start = 0.0
        self.end = 0.0
        self.actions: list[tuple[str, int, float]] = []  # (F or B, micro-batch, seconds), in order

    @property
    def idle(self) -> float:
        """Share of this stage's own step not spent computing (the bubble plus communication)."""
        return 1.0 - self.compute / self.step if self.step > 0 else 0.0

    def idle_in(self, window: float) -> float:
        """Share of ``window`` (the pipeline's step, common to all stages) not spent computing."""
        return 1.0 - self.compute / window if window > 0 else 0.0


def recv_ahead_default(schedule: str) -> bool:
    """Whether the runner posts each receive one action early for the schedule named ``schedule``.

    Measured on the 2-core box (``disttrain bench pipeline-recv-ahead``,
    benchmarks/RESULTS.md): for 1F1B posting when needed was faster (its steady
    state alternates with the peer, so the message an action needs is produced
    just before it and an early post overlaps nothing); for GPipe the early post
    was as fast or faster.
    """
    return schedule != "1f1b"


class PipelineRunner:
    """Runs ``grid`` for stage ``stage`` of ``len(meta_stages)``; ranks are ``group`` ranks."""

    def __init__(
        self,
        module: nn.Module,
        stage: int,
        grid: Grid,
        meta_stages: Sequence[nn.Module],
        loss_fn: LossFn,
        group: ProcessGroup | None = None,
        ranks: list[int] | None = None,
        recompute: bool = False,
        recv_ahead: bool = True,
    ) -> None:
        self.module = module
        self.stage = stage
        self.stages = len(meta_stages)
        self.grid = grid
        self.microbatches = 1 + max(a.microbatch for row in grid for a in row if a is not None)
        self.meta_stages = meta_stages
        self.loss_fn = loss_fn
        self.group = group
        self.ranks = ranks or list(range(self.stages))  # stage -> rank in ``group``
        self.recompute = recompute
        self.recv_ahead = recv_ahead
        self.activations = ActivationMeter([p.detach() for p in module.parameters()])
        self.times = StepTimes()
        self._shapes: dict[tuple[Any, ...], list[tuple[torch.Size, torch.dtype]]] = {}

    # --- shapes -------------------------------------------------------------------
    def boundary_shapes(self, micro: torch.Tensor) -> list[tuple[torch.Size, torch.dtype]]:
        """Shape and dtype of every stage's output for one micro-batch, from a meta run."""
        key = (tuple(micro.shape), micro.dtype)
        if key not in self._shapes:
            out: list[tuple[torch.Size, torch.dtype]] = []
            x = torch.empty(micro.shape, dtype=micro.dtype, device="meta")
            with torch.no_grad():
                for stage in self.meta_stages:
                    x = stage(x)
                    out.append((x.shape, x.dtype))
            self._shapes[key] = out
        return self._shapes[key]

    # --- one step ----------------------------------------------------------------
    def _forward(self, inp: torch.Tensor) -> torch.Tensor:
        if self.recompute and torch.is_grad_enabled():
            # Keep only the stage input; the stage's own activations are recomputed in backward.
            return checkpoint(self.module, inp, use_reentrant=False)
        return self.module(inp)

    def run(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        """One training step's forward and backward; the mean batch loss on the last stage."""
        s, last, m_count = self.stage, self.stages - 1, self.microbatches
        xs, ys = x.chunk(m_count), y.chunk(m_count)
        shapes = self.boundary_shapes(xs[0])
        device = x.device
        inputs: dict[int, torch.Tensor] = {}  # m -> stage input (kept for its .grad)
        outputs: dict[int, torch.Tensor] = {}  # m -> stage output, or scaled loss on the last
        grads: dict[int, torch.Tensor] = {}  # m -> gradient of our output, from s+1
        loss_sum = torch.zeros((), device=device)
        times = self.times = StepTimes()
        self.activations.reset_peak()
        times.start = time.monotonic()
        step_start = time.perf_counter()
        actions = [a for a in (row[s] for row in self.grid) if a is not None]
        # Activations arrive from s-1 in our forward order, gradients from s+1 in
        # our backward order (the same micro-batch order as the sender's).
        acts = _Inbox(
            [a.microbatch for a in actions if a.kind == "F"] if s > 0 else [],
            self.ranks[s - 1] if s > 0 else -1, shapes[s - 1] if s > 0 else None,
            device, self.group, requires_grad=True, ahead=self.recv_ahead,
        )  # fmt: skip
        grads_in = _Inbox(
            [a.microbatch for a in actions if a.kind == "B"] if s < last else [],
            self.ranks[s + 1] if s < last else -1, shapes[s], device, self.group,
            ahead=self.recv_ahead,
        )  # fmt: skip
        sends: list[tuple[Any, torch.Tensor]] = []  # kept alive until their send is done
        for action in actions:
            m = action.microbatch
            t0 = time.perf_counter()
            # waiting for a neighbour is communication, not compute (the trainer's phases)
            if action.kind == "F" and s > 0:
                with timeline.span("send/recv", peer_stage=s - 1), phases.book(COMM):
                    inputs[m] = acts.take(m)
            elif action.kind == "B" and s < last:
                with timeline.span("send/recv", peer_stage=s + 1), phases.book(COMM):
                    grads[m] = grads_in.take(m)
            t1 = time.perf_counter()
            times.comm += t1 - t0
            cpu1 = time.thread_time()
            if action.kind == "F":
                with timeline.span("forward", microbatch=m, stage=s):
                    out = self._do_forward(action, xs, ys, inputs, outputs, m_count)
                if s == last:
                    loss_sum += outputs[m].detach()
            else:
                with timeline.span("backward", microbatch=m, stage=s):
                    out = self._do_backward(action, inputs, outputs, grads)
            t2 = time.perf_counter()
            times.compute += t2 - t1
            times.actions.append((action.kind, m, t2 - t1))
            times.compute_cpu += time.thread_time() - cpu1
            if out is not None:  # to s+1 after a forward, to s-1 after a backward
                peer = s + 1 if action.kind == "F" else s - 1
                # under autocast a stage's output is fp16/bf16, but the peer's buffer has the
                # meta run's dtype (fp32): a shorter message would be silently misread
                out = out.to(shapes[s if action.kind == "F" else s - 1][1])
                with timeline.span("send", peer_stage=peer), phases.book(COMM):
                    sends.append((p2p.isend(out, self.ranks[peer], self.group), out))
            times.comm += time.perf_counter() - t2
        t0 = time.perf_counter()
        with timeline.span("send wait", sends=len(sends)), phases.book(COMM):
            for work, _ in sends:
                work.wait()
        times.comm += time.perf_counter() - t0
        times.step = time.perf_counter() - step_start
        times.end = time.monotonic()
        return loss_sum if s == last else None

    def _do_forward(
        self,
        a: Action,
        xs: tuple[torch.Tensor, ...],
        ys: tuple[torch.Tensor, ...],
        inputs: dict[int, torch.Tensor],
        outputs: dict[int, torch.Tensor],
        m_count: int,
    ) -> torch.Tensor | None:
        m = a.microbatch
        inp = xs[m] if self.stage == 0 else inputs[m]
        with self.activations.recording():
            out = self._forward(inp)
            if self.stage == self.stages - 1:
                outputs[m] = self.loss_fn(out, ys[m]) / m_count
                return None
        outputs[m] = out
        return out.detach()

    def _do_backward(
        self,
        a: Action,
        inputs: dict[int, torch.Tensor],
        outputs: dict[int, torch.Tensor],
        grads: dict[int, torch.Tensor],
    ) -> torch.Tensor | None:
        m = a.microbatch
        out = outputs.pop(m)
        if self.stage == self.stages - 1:
            out.backward()
        else:
            out.backward(grads.pop(m))
        del out  # frees this micro-batch's graph, and its saved activations with it
        if self.stage == 0:
            return None
        inp = inputs.pop(m)
        assert inp.grad is not None
        return inp.grad


class _Inbox:
    """The tensors one neighbour sends, in a known order, each receive posted one ahead.

    Holding one receive in flight beyond the tensor being used keeps the
    transfer off the critical path without holding more than one extra buffer
    (1F1B's activation bound is kept). With ``ahead=False`` each receive is
    posted only when its tensor is needed: gloo moves a message's bytes only
    once its receive is posted, so an early post makes this process's gloo
    thread read them while the stage computes, on a core the compute (and the
    peer) also needs; when the sender's action runs just before the one that
    needs it (1F1B's steady state), the early post overlaps nothing.
    """

    def __init__(
        self,
        order: list[int],
        src: int,
        shape: tuple[torch.Size, torch.dtype] | None,
        device: torch.device,
        group: ProcessGroup | None,
        requires_grad: bool = False,
        ahead: bool = True,
    ) -> None:
        self.ahead = ahead
        self.order = order
        self.src = src
        self.shape = shape
        self.device = device
        self.group = group
        self.requires_grad = requires_grad
        self.next = 0
        self.posted: tuple[int, Any, torch.Tensor] | None = None
        if ahead:
            self._post()

    def _post(self) -> None:
        if self.next >= len(self.order):
            self.posted = None
            return
        assert self.shape is not None
        shape, dtype = self.shape
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        self.posted = (self.order[self.next], p2p.irecv(buf, self.src, self.group), buf)
        self.next += 1

    def take(self, m: int) -> torch.Tensor:
        """Wait for micro-batch ``m``'s tensor (the next in order) and post the following one."""
        if not self.ahead:
            self._post()  # the receive for m, now
        assert self.posted is not None and self.posted[0] == m, (m, self.posted)
        _, work, buf = self.posted
        work.wait()
        if self.ahead:
            self._post()
        else:
            self.posted = None
        if self.requires_grad and buf.is_floating_point():
            buf.requires_grad_(True)
        return buf
