"""Execute a pipeline schedule on one rank: compute the grid's actions, pass tensors on.

Each rank runs its own column of the grid in order (the actions of its stage,
or of its V chunks, stages r, r+P, ... under an interleaved schedule), without
waiting for the other ranks' ticks: a forward's activation is sent to s+1 and a backward's
input gradient to s-1 with ``isend`` and not waited on (the next action starts
at once; all sends are waited on at the end of the step), and the receive
that an action needs is posted one action ahead, so it is usually complete
when the action starts (GPipe), or when the action needs it (1F1B, where the
early post was measured slower: :func:`recv_ahead_default`). A stage
receives only activations from s-1 (in the forward order of s-1) and
gradients from s+1 (in its backward order), each a FIFO stream between one
pair of ranks (``inbox.Inbox``), so both sides agree on what each message is without any
header: the order of each stream is read off the sender's column of the grid,
and activations and gradients travel under two tags (with P = 2 or V > 1 both
come from one neighbour). Under a schedule with W actions, B computes only the
input gradient and W the weight gradients later (``split.py``). The grid's
column order respects every dependency (it is a simulation of the schedule), so
the waits cannot form a cycle. Receive
buffers are shaped by running the whole model once on the ``meta`` device (no
memory, no compute) for each batch shape.

The loss of a micro-batch is scaled by 1/M, so the summed gradients over the
M micro-batches equal the gradient of the mean loss over the whole batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.distributed import ProcessGroup
from torch.utils.checkpoint import checkpoint

from disttrain import batch as batches
from disttrain import timeline
from disttrain.comm import p2p, phases
from disttrain.parallel import chain as chains
from disttrain.parallel.pipeline import split
from disttrain.parallel.pipeline.inbox import Inbox
from disttrain.parallel.pipeline.schedule import SCHEDULES, Action, Grid, replay_kind

__all__ = ["ActivationMeter", "PipelineRunner", "StepTimes", "recv_ahead_default"]

COMM = phases.COMMUNICATION
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


#: The meter's Python hook on every saved tensor costs 8-12 % of a 1F1B step of a 4-block
#: GPT-2 (about 220 saves a step on stage 0; ``disttrain bench hf-parallel
#: --no-activation-meter``). A step's saved bytes follow from its shapes and schedule, so
#: where nothing else needs the hooks (no W action) the first METERED_FIRST steps and every
#: METER_EVERY-th after them are metered; the figures are those of the last metered step.
METERED_FIRST, METER_EVERY = 2, 16


def metered(step: int) -> bool:
    """Whether step ``step`` (0, 1, ...) of a schedule without W counts its activations."""
    return step < METERED_FIRST or step % METER_EVERY == 0


class ActivationMeter:
    """Bytes of tensors saved for backward that are alive now, and their peak.

    Parameters (and views of them) saved by layers are left out: they are not
    activations. A tensor saved twice (a ReLU's output is also the next Linear's
    input) is counted once. A saved tensor is counted from its pack until autograd
    frees the graph that holds it, or until :meth:`release` lets it go early (after
    B, what W does not need). ``grads`` are W's output gradients held from B to W
    (split schedules); ``peak_total`` is the peak of the two together.
    """

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.live = 0
        self.peak = 0
        self.grads = 0
        self.peak_total = 0
        self._param_ptrs = {p.untyped_storage().data_ptr() for p in params}
        self._refs: dict[tuple[int, int], int] = {}  # (address, bytes) -> saves holding it

    def reset_peak(self) -> None:
        self.peak = self.live
        self.peak_total = self.live + self.grads

    def _count(self, key: tuple[int, int], step: int) -> None:
        """One more (``step`` 1) or one fewer (-1) save of the tensor at ``key``."""
        n = self._refs.pop(key, 0) + step
        if n:
            self._refs[key] = n
        if step > 0 and n == 1:  # a new tensor
            self.live += key[1]
            self.peak = max(self.peak, self.live)
            self.peak_total = max(self.peak_total, self.live + self.grads)
        elif not n:  # its last save went
            self.live -= key[1]

    def hold_grads(self, nbytes: int) -> None:
        """W's output gradients, held from B until W (``nbytes`` < 0: W consumed them)."""
        self.grads += nbytes
        self.peak_total = max(self.peak_total, self.live + self.grads)

    @staticmethod
    def release(saved: list[_Saved]) -> None:
        """Let go of these saved tensors now (B has run; W does not read them)."""
        for s in saved:
            s.release()

    @contextmanager
    def recording(self, for_w: Callable[[], bool] | None = None) -> Iterator[list[_Saved]]:
        """Count what the forwards inside save; yield the list of those saves. ``for_w()``,
        asked at each save, marks the ones a split backward's W will read."""
        saves: list[_Saved] = []

        def pack(t: torch.Tensor) -> Any:
            if t.device.type == "meta" or t.untyped_storage().data_ptr() in self._param_ptrs:
                return t
            # detached: a saved *output* held with its grad_fn would form a cycle through
            # C++ (node -> _Saved -> tensor -> node) that outlives a retained graph (B/W split)
            saved = _Saved(t.detach(), self, for_w is not None and for_w())
            saves.append(saved)
            return saved

        def unpack(saved: Any) -> torch.Tensor:
            return saved.get() if isinstance(saved, _Saved) else saved

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield saves


class _Saved:
    """A saved activation that uncounts itself when autograd (or :meth:`release`) lets it go."""

    __slots__ = ("for_w", "key", "meter", "tensor")

    def __init__(self, tensor: torch.Tensor, meter: ActivationMeter, for_w: bool) -> None:
        self.tensor: torch.Tensor | None = tensor
        self.meter = meter
        self.for_w = for_w
        self.key = (tensor.data_ptr(), tensor.numel() * tensor.element_size())
        meter._count(self.key, +1)

    def get(self) -> torch.Tensor:
        if self.tensor is None:
            raise RuntimeError(
                "pipeline W read a tensor released after B: a parameter's gradient depends on "
                "an operation outside the modules that own parameters (tied weights?)"
            )
        return self.tensor

    def release(self) -> None:
        if self.tensor is not None:
            self.tensor = None
            self.meter._count(self.key, -1)

    def __del__(self) -> None:
        self.release()


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
        #: (kind, micro-batch, seconds) in the order run; kind as :func:`schedule.replay` reads it
        self.actions: list[tuple[str, int, float]] = []
        #: the same with each action's CPU time: what it cost without the OS's preemptions
        self.actions_cpu: list[tuple[str, int, float]] = []

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
    was as fast or faster. Each schedule says which (``ScheduleKind.recv_ahead``).
    """
    return SCHEDULES.get(schedule).recv_ahead


ACT, GRAD = 0, 1  # the tags of the two streams between neighbours


class PipelineRunner:
    """Runs ``grid``'s column ``stage`` (a rank of ``len(grid[0])``); ranks are ``group`` ranks.

    ``module`` is the rank's stage, or its chunks (one module per virtual stage,
    stages r, r+P, ...); ``meta_stages`` are all P·V stages on the meta device.
    """

    def __init__(
        self,
        module: nn.Module | Sequence[nn.Module],
        stage: int,
        grid: Grid,
        meta_stages: Sequence[nn.Module],
        loss_fn: LossFn,
        group: ProcessGroup | None = None,
        ranks: list[int] | None = None,
        recompute: bool = False,
        recv_ahead: bool = True,
    ) -> None:
        self.chunks = list(module) if isinstance(module, Sequence) else [module]
        self.module = self.chunks[0] if len(self.chunks) == 1 else nn.ModuleList(self.chunks)
        self.stage = stage  # this rank's index in the pipeline
        self.pipeline = len(grid[0])  # P ranks
        self.stages = len(meta_stages)  # P·V model stages
        self.grid = grid
        self.microbatches = 1 + max(a.microbatch for row in grid for a in row if a is not None)
        self.split = any(a is not None and a.kind == "W" for row in grid for a in row)
        self.meta_stages = meta_stages
        self.loss_fn = loss_fn
        self.group = group
        self.ranks = ranks or list(range(self.pipeline))  # pipeline rank -> rank in ``group``
        self.recompute = recompute
        self.recv_ahead = recv_ahead
        self.activations = ActivationMeter([p.detach() for p in self.module.parameters()])
        #: peak bytes of layer-output gradients held from B to W (split schedules)
        self.pending_w_peak = 0
        self.recorders = [split.Recorder(c) for c in self.chunks] if self.split else []
        self.times = StepTimes()
        self.steps_run = 0
        self.metering = True  # this step counts its saved activations (split: always)
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

    def _rank_of(self, stage: int) -> int:
        return stage % self.pipeline

    def _stream(
        self, sender: int, kind: str, to_me: Callable[[int], bool]
    ) -> list[tuple[int, int]]:
        """(micro-batch, receiving stage) of what ``sender`` sends us, in its order."""
        step = 1 if kind == "F" else -1
        return [
            (a.microbatch, a.stage + step)
            for a in (row[sender] for row in self.grid)
            if a is not None and a.kind == kind and to_me(a.stage + step)
        ]

    # --- one step ----------------------------------------------------------------
    def _forward(self, chunk: nn.Module, inp: torch.Tensor) -> torch.Tensor:
        if self.recompute and torch.is_grad_enabled() and not self.split:
            # Keep only the stage input; the stage's own activations are recomputed in backward.
            return checkpoint(chunk, inp, use_reentrant=False)
        return chunk(inp)

    def run(self, x: torch.Tensor, y: Any) -> torch.Tensor | None:
        """One training step's forward and backward; the mean batch loss on the last stage."""
        r, p, last, m_count = self.stage, self.pipeline, self.stages - 1, self.microbatches
        # the targets may be a dict (a transformers batch: the loss reads its labels)
        xs, ys = x.chunk(m_count), tuple(batches.split(y, m_count))
        shapes = self.boundary_shapes(xs[0])
        device = x.device
        st = _StepState(xs, ys)
        loss_sum = torch.zeros((), device=device)
        times = self.times = StepTimes()
        self.metering = self.split or metered(self.steps_run)
        self.steps_run += 1
        if self.metering:
            self.activations.reset_peak()
            self.pending_w_peak = 0
        times.start = time.monotonic()
        step_start = time.perf_counter()
        actions = [a for a in (row[r] for row in self.grid) if a is not None]
        acts, grads_in = self._inboxes(shapes, device)
        sends: list[tuple[Any, torch.Tensor]] = []  # kept alive until their send is done
        for action in actions:
            m = action.microbatch
            t0 = time.perf_counter()
            self._receive(action, st, acts, grads_in)
            t1 = time.perf_counter()
            times.comm += t1 - t0
            cpu1 = time.thread_time()
            with chains.micro_batch(st.ys[m]):  # a block's padding mask (parallel/chain.py)
                out = self._compute(action, st, loss_sum)
            t2 = time.perf_counter()
            times.compute += t2 - t1
            cpu = time.thread_time() - cpu1
            times.actions.append((replay_kind(action, p), m, t2 - t1))
            times.actions_cpu.append((replay_kind(action, p), m, cpu))
            times.compute_cpu += cpu
            if out is not None:  # to s+1 after a forward, to s-1 after a backward
                self._send(action, out, shapes, sends)
            times.comm += time.perf_counter() - t2
        t0 = time.perf_counter()
        with timeline.span("send wait", sends=len(sends)), phases.book(COMM):
            for work, _ in sends:
                work.wait()
        times.comm += time.perf_counter() - t0
        times.step = time.perf_counter() - step_start
        times.end = time.monotonic()
        return loss_sum if r == last % p else None

    def _inboxes(
        self, shapes: list[tuple[torch.Size, torch.dtype]], device: torch.device
    ) -> tuple[Inbox, Inbox]:
        """The step's two receive streams: activations from the previous rank, gradients from
        the next, each in the order its sender's column of the grid sends them."""
        r, p, last = self.stage, self.pipeline, self.stages - 1
        mine = lambda s: 0 <= s <= last and self._rank_of(s) == r  # noqa: E731
        prev, nxt = (r - 1) % p, (r + 1) % p
        acts = Inbox(
            [(k, shapes[k[1] - 1]) for k in self._stream(prev, "F", mine)],
            self.ranks[prev],
            device,
            self.group,
            ACT,
            requires_grad=True,
            ahead=self.recv_ahead,
        )
        grads_in = Inbox(
            [(k, shapes[k[1]]) for k in self._stream(nxt, "B", mine)],
            self.ranks[nxt],
            device,
            self.group,
            GRAD,
            ahead=self.recv_ahead,
        )
        return acts, grads_in

    def _receive(self, action: Action, st: _StepState, acts: Inbox, grads_in: Inbox) -> None:
        """Take what the action needs from a neighbour: a forward's input (not on stage 0), a
        backward's output gradient (not on the last stage). Booked as communication."""
        key, s, last = (action.microbatch, action.stage), action.stage, self.stages - 1
        # waiting for a neighbour is communication, not compute (the trainer's phases)
        if action.kind == "F" and s > 0:
            with timeline.span("send/recv", peer_stage=s - 1), phases.book(COMM):
                st.inputs[key] = acts.take(key)
        elif action.kind == "B" and s < last:
            with timeline.span("send/recv", peer_stage=s + 1), phases.book(COMM):
                st.grads[key] = grads_in.take(key)

    def _compute(
        self, action: Action, st: _StepState, loss_sum: torch.Tensor
    ) -> torch.Tensor | None:
        """Run one F, B or W action; return what goes to a neighbour, if anything.

        A forward on the last stage adds its micro-batch's loss into ``loss_sum`` (in place).
        """
        m, s = action.microbatch, action.stage
        key = (m, s)
        out: torch.Tensor | None = None
        if action.kind == "F":
            with timeline.span("forward", microbatch=m, stage=s):
                out = self._do_forward(action, st, self.microbatches)
            if s == self.stages - 1:
                loss_sum += st.outputs[key].detach()
        elif action.kind == "B":
            name = "backward input" if self.split else "backward"
            with timeline.span(name, microbatch=m, stage=s):
                out = self._do_backward(action, st)
        else:
            with timeline.span("backward weight", microbatch=m, stage=s):
                pending = st.pending.pop(key)
                split.backward_weight(pending)
                self.activations.hold_grads(-pending.nbytes)
                del pending  # the graph goes with it, and its saved activations
        return out

    def _send(
        self,
        action: Action,
        out: torch.Tensor,
        shapes: list[tuple[torch.Size, torch.dtype]],
        sends: list[tuple[Any, torch.Tensor]],
    ) -> None:
        """Post ``out``'s send to stage s+1 after a forward, s-1 after a backward, into ``sends``.

        The message has the meta run's dtype, which the peer's buffer has.
        """
        s = action.stage
        dst = s + 1 if action.kind == "F" else s - 1
        # under autocast a stage's output is fp16/bf16, but the peer's buffer has the
        # meta run's dtype (fp32): a shorter message would be silently misread
        out = out.to(shapes[s if action.kind == "F" else s - 1][1])
        tag = ACT if action.kind == "F" else GRAD
        with timeline.span("send", peer_stage=dst), phases.book(COMM):
            peer = self.ranks[self._rank_of(dst)]
            sends.append((p2p.isend(out, peer, self.group, tag=tag), out))

    def _do_forward(self, a: Action, st: _StepState, m_count: int) -> torch.Tensor | None:
        m, s = a.microbatch, a.stage
        key = (m, s)
        chunk = self.chunks[s // self.pipeline]
        inp = st.xs[m] if s == 0 else st.inputs[key]
        if self.split and self.recompute:
            # keep the input only; B runs the forward again (same RNG state) before its backward
            st.rng[key] = torch.get_rng_state()
            with torch.no_grad():
                out = chunk(inp)
            if s == self.stages - 1:
                st.outputs[key] = self.loss_fn(out, st.ys[m]).detach() / m_count
                return None
            return out.detach()
        rec = self.recorders[s // self.pipeline] if self.split else None
        unmetered: list[_Saved] = []
        saving: AbstractContextManager[list[_Saved]] = nullcontext(unmetered)
        if self.metering:
            saving = self.activations.recording(rec.inside if rec else None)
        with saving as saves:
            if rec is not None:
                with rec.recording() as layers:
                    out = self._forward(chunk, inp)
                st.layers[key], st.saves[key] = layers, saves
            else:
                out = self._forward(chunk, inp)
            if s == self.stages - 1:
                st.outputs[key] = self.loss_fn(out, st.ys[m]) / m_count
                return None
        st.outputs[key] = out
        return out.detach()

    def _recompute(self, a: Action, st: _StepState) -> None:
        """Run a split schedule's forward again at B, from the kept input (``--recompute``)."""
        m, s = a.microbatch, a.stage
        key = (m, s)
        chunk = self.chunks[s // self.pipeline]
        inp = st.xs[m] if s == 0 else st.inputs[key]
        rec = self.recorders[s // self.pipeline]
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(st.rng.pop(key))
            with (
                self.activations.recording(rec.inside) as saves,
                rec.recording() as layers,
            ):
                out = chunk(inp)
                if s == self.stages - 1:
                    out = self.loss_fn(out, st.ys[m]) / self.microbatches
        st.outputs[key] = out
        st.layers[key], st.saves[key] = layers, saves

    def _do_backward(self, a: Action, st: _StepState) -> torch.Tensor | None:
        m, s = a.microbatch, a.stage
        key = (m, s)
        last = s == self.stages - 1
        if self.split:
            if self.recompute:
                self._recompute(a, st)
            inp = st.inputs.pop(key) if s > 0 else None
            grad_in, pending = split.backward_input(
                st.outputs.pop(key), None if last else st.grads.pop(key), inp, st.layers.pop(key)
            )
            # W reads only what the parameter-owning layers saved: the rest goes now, and
            # with the output dropped, the graph's nodes after the last such layer too
            self.activations.release([t for t in st.saves.pop(key) if not t.for_w])
            st.pending[key] = pending
            self.activations.hold_grads(pending.nbytes)
            self.pending_w_peak = max(self.pending_w_peak, self.activations.grads)
            return grad_in
        out = st.outputs.pop(key)
        grad = None if last else st.grads.pop(key)
        # a first stage without parameters (a Flatten alone) has nothing to differentiate
        if out.requires_grad:
            out.backward(grad)
        del out  # frees this micro-batch's graph, and its saved activations with it
        if s == 0:
            return None
        inp = st.inputs.pop(key)
        assert inp.grad is not None
        return inp.grad


class _StepState:
    """One step's tensors, keyed by (micro-batch, stage)."""

    def __init__(self, xs: tuple[torch.Tensor, ...], ys: tuple[Any, ...]) -> None:
        self.xs, self.ys = xs, ys
        self.inputs: dict[tuple[int, int], torch.Tensor] = {}  # stage input (for its .grad)
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}  # stage output, or scaled loss
        self.grads: dict[tuple[int, int], torch.Tensor] = {}  # gradient of the output, from s+1
        self.layers: dict[tuple[int, int], split.Layers] = {}  # where W starts, per layer
        self.saves: dict[tuple[int, int], list[_Saved]] = {}  # what F saved (split schedules)
        self.pending: dict[tuple[int, int], split.PendingW] = {}  # B done, W not yet
        self.rng: dict[tuple[int, int], torch.Tensor] = {}  # RNG state at F (recompute)
