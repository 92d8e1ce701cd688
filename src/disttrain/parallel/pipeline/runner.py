"""Execute a pipeline schedule on one stage: compute the grid's actions, pass tensors on.

Every stage walks the same grid tick by tick. After the compute of a tick,
neighbours swap what that tick produced: stage s sends the activation of a
forward to s+1 and receives, in the same ``p2p.exchange``, the gradient that
s+1's backward produced. Both sides read the grid, so they agree on who sends
what without any header. Pairs (s, s+1) with even s exchange first, odd s
second (odd-even ordering), so no cycle of waits can form and the chain of
stages never serialises. Receive buffers are shaped by running the whole model
once on the ``meta`` device (no memory, no compute) for each batch shape.

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
from disttrain.comm import p2p
from disttrain.parallel.pipeline.schedule import Action, Grid

__all__ = ["ActivationMeter", "PipelineRunner", "StepTimes"]

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
    """Where one stage's step went: compute (busy), communication, and the whole step."""

    def __init__(self) -> None:
        self.compute = 0.0
        self.comm = 0.0
        self.step = 0.0

    @property
    def idle(self) -> float:
        """Share of the step not spent computing: the measured bubble (plus communication)."""
        return 1.0 - self.compute / self.step if self.step > 0 else 0.0


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
        step_start = time.perf_counter()
        for row in self.grid:
            action = row[s]
            send_act: torch.Tensor | None = None
            send_grad: torch.Tensor | None = None
            if action is not None:
                t0 = time.perf_counter()
                if action.kind == "F":
                    with timeline.span("forward", microbatch=action.microbatch, stage=s):
                        send_act = self._do_forward(action, xs, ys, inputs, outputs, m_count)
                    if s == last:
                        loss_sum += outputs[action.microbatch].detach()
                else:
                    with timeline.span("backward", microbatch=action.microbatch, stage=s):
                        send_grad = self._do_backward(action, inputs, outputs, grads)
                times.compute += time.perf_counter() - t0
            t0 = time.perf_counter()
            for peer in (s + 1, s - 1) if s % 2 == 0 else (s - 1, s + 1):
                if 0 <= peer < self.stages:
                    self._swap(row, peer, send_act, send_grad, shapes, inputs, grads, device)
            times.comm += time.perf_counter() - t0
        times.step = time.perf_counter() - step_start
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

    def _swap(
        self,
        row: list[Action | None],
        peer: int,
        send_act: torch.Tensor | None,
        send_grad: torch.Tensor | None,
        shapes: list[tuple[torch.Size, torch.dtype]],
        inputs: dict[int, torch.Tensor],
        grads: dict[int, torch.Tensor],
        device: torch.device,
    ) -> None:
        """Exchange with one neighbour what this tick produced for each other."""
        theirs = row[peer]
        send: torch.Tensor | None = None
        recv: torch.Tensor | None = None
        if peer > self.stage:  # the next stage: our activation out, its gradient in
            send = send_act
            if send is not None:
                # under autocast the stage's output is fp16/bf16, but the peer's buffer has the
                # meta run's dtype (fp32): a shorter message would be silently misread
                send = send.to(shapes[self.stage][1])
            if theirs is not None and theirs.kind == "B":
                shape, dtype = shapes[self.stage]
                recv = grads[theirs.microbatch] = torch.empty(shape, dtype=dtype, device=device)
        else:  # the previous stage: our input gradient out, its activation in
            send = send_grad
            if theirs is not None and theirs.kind == "F":
                shape, dtype = shapes[peer]
                recv = torch.empty(shape, dtype=dtype, device=device)
                inputs[theirs.microbatch] = recv
        if send is None and recv is None:
            return
        with timeline.span("send/recv", peer_stage=peer):
            p2p.exchange(send, self.ranks[peer], recv, self.ranks[peer], self.group)
        if recv is not None and peer < self.stage and recv.is_floating_point():
            recv.requires_grad_(True)
