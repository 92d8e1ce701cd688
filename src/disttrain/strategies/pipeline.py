"""Layer placement and pipeline parallelism: each rank holds consecutive layers (a stage).

``--schedule none`` runs the whole batch through the stages one after the
other (the seed's "not good" baseline: P-1 of P stages wait at any time);
``gpipe`` and ``1f1b`` cut it into ``--microbatches`` and overlap the stages
(idle share (P-1)/(M+P-1)); ``interleaved`` cuts the model into P·V stages,
rank p holding p, p+P, ... (``--virtual-stages V``); ``zb1`` and ``zb2`` split
each backward into B and W (``parallel/pipeline/``: one file per schedule family,
each owning its bubble and memory formulas). Every stage sees the whole global
batch: stage 0 feeds the input, the last computes the loss against the labels.
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup

from disttrain import costing
from disttrain.comm import p2p, phases
from disttrain.comm.errors import UsageError
from disttrain.comm.meter import meter
from disttrain.comm.world import World
from disttrain.config import RunConfig
from disttrain.parallel import placement
from disttrain.parallel.pipeline import schedule
from disttrain.parallel.pipeline.runner import PipelineRunner, recv_ahead_default
from disttrain.parallel.settings import ParallelConfig
from disttrain.strategies.base import LossFn, Strategy, register

if TYPE_CHECKING:
    from disttrain.strategies.runspec import RunSpec

__all__ = ["Pipeline", "check_pipeline", "pipeline_settings_not_read"]


def pipeline_settings_not_read(pc: ParallelConfig) -> dict[str, str]:
    """The pipeline settings that ``pc``'s schedule switches off, and why."""
    unread = {}
    if pc.schedule == "none":
        unread["microbatches"] = "with --schedule none (whole batches)"
    if not schedule.SCHEDULES.get(pc.schedule).virtual:
        unread["virtual_stages"] = f"with --schedule {pc.schedule} (one stage per rank)"
    return unread


def check_pipeline(
    model: nn.Module, stages: int, batch: int, pc: ParallelConfig, stages_flag: str
) -> None:
    """UsageError naming the number to change if ``model`` cannot be pipelined so."""
    layers = placement.check_sequential(model, "pipeline")
    v = pc.chunks
    if stages * v > len(layers):
        if v == 1:
            raise UsageError(
                f"{stages_flag} {stages} is more than the model's {len(layers)} layers: "
                f"use at most {len(layers)} stages"
            )
        raise UsageError(
            f"{stages_flag} {stages} x --virtual-stages {v} = {stages * v} stages is more than "
            f"the model's {len(layers)} layers: use at most {len(layers) // stages} virtual stages"
        )
    if pc.schedule != "none":
        why = schedule.SCHEDULES.get(pc.schedule).check(pc.microbatches, stages, v)
        if why:
            raise UsageError(why)
    spec = pc.balance_spec()
    if isinstance(spec, list):
        if len(spec) != stages * v:
            raise UsageError(
                f"--balance {pc.balance} lists {len(spec)} stages but there are {stages * v}: "
                f"give {stages * v} layer counts"
            )
        if sum(spec) != len(layers):
            raise UsageError(
                f"--balance {pc.balance} places {sum(spec)} layers but the model has "
                f"{len(layers)}: make the counts add up to {len(layers)}"
            )
    placement.check_every_rank_trains(layers, stages, v, spec, pc.balance)
    if pc.schedule != "none" and batch % pc.microbatches:
        divisors = [d for d in range(1, batch + 1) if batch % d == 0]
        raise UsageError(
            f"--microbatches {pc.microbatches} does not divide the batch of {batch} per "
            f"pipeline: use one of {', '.join(map(str, divisors[:12]))}"
        )


def _stage_shares(
    pc: ParallelConfig, ranks: int, chunks: int, layer_params: tuple[int, ...] | None
) -> list[float] | None:
    """Each model stage's share of the work under a ``--balance`` list: its layers' share of
    the parameters where the model is known (``layer_params``: dense layers compute in
    proportion), else its share of the layers; None for the equal cut (``params``, and
    ``time``, which only training measures)."""
    spec = pc.balance_spec()
    if not isinstance(spec, list):
        return None
    if len(spec) != ranks * chunks:
        raise ValueError(f"--balance {pc.balance} lists {len(spec)} stages, not {ranks * chunks}")
    if layer_params is None or len(layer_params) != sum(spec) or not sum(layer_params):
        return [n / sum(spec) for n in spec]  # unknown model (or not this cut: no memory row)
    return [sum(layer_params[a:b]) / sum(layer_params) for a, b in placement.stage_bounds(spec)]


def _rank_share(shares: list[float] | None, ranks: int) -> float:
    """The largest share of the parameters one rank holds (its stages r, r+P, ...)."""
    return 1 / ranks if shares is None else max(sum(shares[r::ranks]) for r in range(ranks))


def _replayed_step(
    name: str, m: int, ranks: int, chunks: int, shares: list[float], seconds: float
) -> float:
    """The schedule's step when stage s takes ``shares[s]`` of ``seconds`` (the whole batch's
    compute on one rank), F:B:W = 1:1:1 (a fused B is B + W), hand-offs instant."""
    grid = schedule.build(name, m, ranks, chunks)
    micro = 1 + max(a.microbatch for row in grid for a in row if a is not None)
    split = any(a is not None and a.kind == "W" for row in grid for a in row)
    part = {"F": 1 / 3, "B": 1 / 3 if split else 2 / 3, "W": 1 / 3}
    orders = [
        [
            (
                schedule.replay_kind(a, ranks),
                a.microbatch,
                seconds / micro * shares[a.stage] * part[a.kind],
            )
            for _, a in schedule.stage_actions(grid, r)
        ]
        for r in range(ranks)
    ]
    return schedule.replay(orders, virtual=chunks)[0]


def _runnable_microbatches(
    spec: RunSpec, pc: ParallelConfig, kind: schedule.ScheduleKind, p: int, v: int
) -> int:
    """The M a run would use: the spec's (train's default 4 unless stated); unstated, raised
    to the least count the schedule accepts (e.g. a multiple of P for interleaved).

    A refusal that no count within 4PV more lifts is the spec's to fix: ValueError.
    """
    m = pc.microbatches
    why = kind.check(m, p, v) if p > 1 else ""  # one stage: no pipeline to refuse
    if why and "microbatches" not in spec.settings:
        # unstated: the least count from train's default up that the schedule runs (a
        # refusal that no count within 4PV more lifts is the spec's to fix)
        m = next((n for n in range(m, m + 4 * p * v + 1) if not kind.check(n, p, v)), m)
        why = kind.check(m, p, v)
    if why:
        raise ValueError(why)
    return m


def _pipelined_seconds(
    name: str,
    kind: schedule.ScheduleKind,
    m: int,
    p: int,
    v: int,
    shares: list[float] | None,
    busy: float,
) -> tuple[float, float]:
    """(the pipelined compute of a step, its bubble) for ``busy`` seconds of work a rank.

    Equal stages (or one): busy / (1 - bubble), the schedule's closed form. Unequal
    stages (each stage's share its layers' share of the parameters, ``work.layer_params``
    where advise knows the model; else of the layers): the schedule's grid replayed with
    each stage's F, B, W at its share (``schedule.replay``: the slowest stage sets the
    pace), and the bubble 1 - busy / step.
    """
    bubble = kind.bubble(m, p, v)
    if shares is None or p == 1:  # equal stages (or one): the schedule's closed form
        return busy / (1 - bubble), bubble
    pipelined = _replayed_step(name, m, p, v, shares, busy * p)
    return pipelined, 1 - busy / pipelined


def _hand_off_seconds(
    net: costing.Network, message: float, sends: int, p: int, v: int, compute: float
) -> float:
    """Seconds of a step spent waiting for hand-offs between stages.

    The fill and drain cross 2(PV-1) stage boundaries on the critical path, each an α and
    a micro-batch's activations at β; the steady state's ``sends`` hand-offs are hidden
    behind the compute unless the link needs longer.
    """
    hand_off = net.alpha + message * net.beta
    # the fill and drain wait for their hand-offs; the steady state's overlap the compute
    # unless the link needs longer than the compute for all of them
    fill_drain = 2 * (p * v - 1) if p > 1 else 0  # stage boundaries between ranks
    return fill_drain * hand_off + max(0.0, sends * hand_off - compute)


@register
class Pipeline(Strategy):
    """Stage ``s`` of ``P`` on rank ``s``; micro-batches flow through by ``--schedule``."""

    name = "pipeline"
    shares_activations: ClassVar[bool] = True  # stages or slices exchange activations
    main_setting: ClassVar[str | None] = "schedule"
    cost_settings: ClassVar[tuple[str, ...]] = (
        "schedule",
        "microbatches",
        "virtual_stages",
        "balance",
    )
    assumptions: ClassVar[dict[str, str]] = {
        "activation_bytes": "bytes per sample crossing a stage boundary (else not counted)"
    }
    reads_settings = (
        "stages",
        "microbatches",
        "schedule",
        "virtual_stages",
        "balance",
        "recompute",
    )

    @classmethod
    def settings_not_read(cls, config: RunConfig) -> dict[str, str]:
        return pipeline_settings_not_read(config.section(ParallelConfig))

    def __init__(self, config: RunConfig, world: World, loss_fn: LossFn) -> None:
        super().__init__(config, world, loss_fn)
        self.pc: ParallelConfig = config.section(ParallelConfig)
        self.bind(None, list(range(world.world_size)), config.train.batch_size)

    def bind(self, group: ProcessGroup | None, ranks: list[int], batch: int) -> None:
        """Run as the pipeline of global ``ranks`` (``group``), on batches of ``batch``."""
        self.group = group
        self.stages = len(ranks)  # P pipeline ranks; the model is cut into P·V stages
        self.stage = ranks.index(self.world.rank)
        self.batch = batch
        self.chunks = self.pc.chunks

    @classmethod
    def validate_config(cls, config: RunConfig, model: nn.Module) -> None:
        pc: ParallelConfig = config.section(ParallelConfig)
        world = config.train.world_size
        if pc.stages and pc.stages != world:
            raise UsageError(
                f"--stages {pc.stages} needs one worker per stage: "
                f"set --workers {pc.stages} (or --stages {world})"
            )
        check_pipeline(model, world, config.train.batch_size, pc, "--workers")

    @property
    def data_rank(self) -> int:
        return 0

    @property
    def data_world_size(self) -> int:
        return 1  # every stage sees the whole batch

    @property
    def microbatches(self) -> int:
        return 1 if self.pc.schedule == "none" else self.pc.microbatches

    # --- splitting ------------------------------------------------------------------
    def _sizes(self, model: nn.Sequential, sample: torch.Tensor) -> list[int]:
        spec = self.pc.balance_spec()
        cuts = self.stages * self.chunks
        if isinstance(spec, list):
            return spec
        if spec == "params":
            return placement.param_sizes(list(model), cuts)
        # "time": measured on stage 0 only, so that every stage agrees on the split
        sizes = torch.zeros(cuts, dtype=torch.int64)
        if self.stage == 0:
            layers = list(model)  # timed on one micro-batch, as each stage runs them
            costs = placement.time_costs(layers, sample[: self.batch // self.microbatches])
            owns = placement.owns_parameters(layers)
            sizes = torch.tensor(placement.partition_layers(costs, owns, cuts))
        if self.stages > 1:
            with meter.paused():
                dist.broadcast(sizes, src=p2p.global_rank(self.group, 0), group=self.group)
        return [int(n) for n in sizes]

    def prepare_model(self, model: nn.Module, sample: torch.Tensor) -> nn.Module:
        placement.check_sequential(model, self.name)
        assert isinstance(model, nn.Sequential)
        self.sizes = self._sizes(model, sample)
        # measured (time) cuts are known only now; every rank has the same sizes, so all stop
        placement.check_every_rank_trains(
            list(model), self.stages, self.chunks, self.sizes, self.pc.balance
        )
        parts = placement.split(model, self.sizes)
        meta = [copy.deepcopy(part).to("meta") for part in parts]
        self.full = model if self.stage == 0 else None  # stage 0 gathers the model to evaluate
        grid = schedule.build(self.pc.schedule, self.microbatches, self.stages, self.chunks)
        mine = parts[self.stage :: self.stages]  # stages p, p+P, ... (one unless interleaved)
        # late-bound: the step runner wraps self.loss_fn with the fp16 loss scale after this
        self.runner = PipelineRunner(
            mine,
            self.stage,
            grid,
            meta,
            lambda out, y: self.loss_fn(out, y),
            self.group,
            recompute=self.pc.recompute,
            recv_ahead=recv_ahead_default(self.pc.schedule),
        )
        return self.runner.module

    # --- the step -------------------------------------------------------------------
    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = self.runner.run(x, y)
        last = self.stages - 1
        if self.stages > 1 and self.stage in (0, last):
            # only so that rank 0 logs the true loss; stage 0 waits for the last stage here
            with meter.paused(), phases.book(phases.COMMUNICATION):
                if self.stage == last:
                    assert loss is not None
                    p2p.send(loss.reshape(1), 0, self.group)
                else:
                    loss = torch.empty(1, device=x.device)
                    p2p.recv(loss, last, self.group)
                    loss = loss[0]
        return loss if loss is not None else torch.tensor(float("nan"))

    def eval_model(self) -> nn.Module | None:
        """Stage 0 receives every other stage's tensors into its copy of the whole model."""
        with torch.no_grad():
            if self.stage == 0:
                assert self.full is not None
                parts = placement.split(self.full, self.sizes)
                for s, part in enumerate(parts):
                    if s % self.stages:  # stages p, p+P, ... are rank p's
                        for t in part.state_dict().values():
                            p2p.recv(t, s % self.stages, self.group)
            else:
                for chunk in self.runner.chunks:
                    for t in chunk.state_dict().values():
                        p2p.send(t.contiguous(), 0, self.group)
        return self.full if self.stage == 0 and self.world.rank == 0 else None

    def summary(self) -> dict[str, Any]:
        m, p, v = self.microbatches, self.stages, self.chunks
        kind = schedule.SCHEDULES.get(self.pc.schedule)
        return {
            "pipeline": {
                "stages": p,
                "schedule": self.pc.schedule,
                "virtual_stages": v,
                "microbatches": m,
                "layers_per_stage": self.sizes,
                "bubble_theory": kind.bubble(m, p, v),
                "stage0_idle_share": self.runner.times.idle,
                "stage0_peak_activation_bytes": self.runner.activations.peak,
                "stage0_peak_pending_weight_grad_bytes": self.runner.pending_w_peak,
                "stage0_peak_activation_and_weight_grad_bytes": self.runner.activations.peak_total,
                "recompute": self.pc.recompute,
            }
        }

    # --- the cost model (``disttrain advise``) ------------------------------------------
    @classmethod
    def advise_specs(cls) -> list[str]:
        """One row per schedule family: 1F1B, interleaved (V = 2), ZB-H1, ZB-H2."""
        return [
            f"{cls.name}:1f1b",
            f"{cls.name}:interleaved:virtual_stages=2",
            f"{cls.name}:zb1",
            f"{cls.name}:zb2",
        ]

    @classmethod
    def predict(
        cls,
        spec: RunSpec,
        work: costing.Workload,
        nodes: int,
        network: costing.Network,
        calibration: costing.Rates,
    ) -> costing.Prediction:
        """P = ``nodes`` equal stages, one per rank, each computing 1/P of the model.

        The schedule's own terms (``ScheduleKind.bubble``, ``.held``) give the step: busy /
        (1 - bubble), exact for equal stages with F:B:W = 1:1:1 (6·params flops: forward 2,
        input gradient 2, weight gradient 2), and for the fused schedules at any F:B (their
        idle time is (P-1)(F+B) per chunk). M is the spec's (:func:`_runnable_microbatches`),
        as ``disttrain train``/``compare`` would run it. The hand-offs:
        :func:`_hand_off_seconds`. Activations: ``activation_bytes`` a sample,
        else 4·sqrt(params) (fp32 values as wide as a one-layer square model: an upper bound
        on a deeper dense model's width). ``balance`` as a list of layer counts (``3/2/3``)
        cuts the work unequally (:func:`_pipelined_seconds`), its rank's parameters at its
        share. ``balance=params`` is the equal cut; ``balance=time`` is measured in
        training and modelled as equal (said in the note). Not modelled: the split backward's
        own overhead, a micro-batch too small to compute efficiently.
        """
        pc = spec.config().section(ParallelConfig)
        kind = schedule.SCHEDULES.get(pc.schedule)
        p, v = nodes, pc.chunks
        m = _runnable_microbatches(spec, pc, kind, p, v)
        net, cal = network, calibration
        busy = work.batch_size * work.flops * cal.seconds_per_flop / p
        shares = _stage_shares(pc, p, v, work.layer_params)
        own = work.params * _rank_share(shares, p) * cal.seconds_per_param + cal.seconds_per_step
        pipelined, bubble = _pipelined_seconds(pc.schedule, kind, m, p, v, shares, busy)
        compute = (pipelined + own) * cal.colocation_factor(work.ranks_per_host)
        # unstated: the width of a model that is one square layer, sqrt(params) values, which
        # bounds the width of any deeper dense model of as many parameters from above
        stated = spec.assumptions.get("activation_bytes")
        per_sample = stated if stated is not None else 4 * math.sqrt(work.params)
        message = work.batch_size / m * per_sample  # one micro-batch's activations
        sends = 2 * m * v if p > 1 else 0  # an activation on, a gradient back, per chunk action
        comm = _hand_off_seconds(net, message, sends, p, v, compute)
        held = kind.held(m, p, v, 0)
        reason = (
            f"{pc.schedule}: bubble {bubble:.1%} of the step at M={m}, V={v}; "
            f"stage 0 holds {held:g} micro-batches' activations (1F1B: {min(m, p)})"
        )
        note = "equal stages" if shares is None else f"stages of {pc.balance} layers"
        note += ", F:B:W = 1:1:1"
        if pc.balance == "time":
            note += "; balance=time is measured in training: equal stages assumed"
        if stated is None:
            note += f"; assumes {per_sample:.3g} B of activations a sample (activation_bytes=)"
        bound = "bandwidth" if message * net.beta > net.alpha else "latency"  # or compute
        pred = costing.finish(
            spec.label, p, compute, comm, sends * message, sends, bound, reason, work, cal, note
        )
        # the step without the bubble and the hand-offs: each rank's share of the work (an
        # equal one: what an uneven cut loses counts against the efficiency)
        ideal = (busy + own) * cal.colocation_factor(work.ranks_per_host)
        return replace(pred, efficiency=ideal / pred.step_seconds)

    # --- checkpoints: the layout of stages is part of the state ----------------------
    def stage_layout(self) -> dict[str, Any]:
        """Which layers this rank holds: the schedule's chunks and the layers per stage."""
        return {"ranks": self.stages, "chunks": self.chunks, "layers_per_stage": self.sizes}

    def state_dict(self) -> dict[str, Any]:
        return {"pipeline_layout": self.stage_layout()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("pipeline_layout")
        if saved is not None and saved != self.stage_layout():
            raise UsageError(
                f"--resume: the checkpoint's pipeline holds {saved['layers_per_stage']} layers "
                f"per stage on {saved['ranks']} ranks x {saved['chunks']} chunks, this run "
                f"{self.sizes} on {self.stages} x {self.chunks}: resume with the same "
                "--schedule, --virtual-stages and --balance"
            )

    # --- memory (``disttrain advise``: the rows of advise_specs above) ---------------------
    @classmethod
    def predict_memory(
        cls, spec: RunSpec, work: costing.Workload, nodes: int, model: nn.Module
    ) -> costing.Memory:
        """One worker per stage (P = nodes; V chunks each where the schedule interleaves),
        cut as training cuts them (``--balance``): the rank with the most parameters holds
        them, their gradients and optimizer state (Adam: 16 bytes each). Activations, the
        schedule's part, are not counted (``summary.json`` ``stage0_peak_activation_bytes``)."""
        pc: ParallelConfig = spec.config().section(ParallelConfig)
        layers = placement.check_sequential(model, cls.name)
        cuts = nodes * pc.chunks
        if cuts > len(layers):
            raise ValueError(
                f"{cuts} stages need as many layers; the model has {len(layers)} "
                "(its modules in order, activations included)"
            )
        balance = pc.balance_spec()
        note = "--balance time: split as params (training measures the layers)"
        if isinstance(balance, list):
            if len(balance) != cuts or sum(balance) != len(layers):
                raise ValueError(
                    f"--balance {pc.balance} does not cut {len(layers)} layers into {cuts} stages"
                )
            sizes, note = balance, ""
        else:
            sizes = placement.param_sizes(layers, cuts)
            note = note if balance == "time" else ""
        counts = [
            sum(p.numel() for layer in layers[a:b] for p in layer.parameters())
            for a, b in placement.stage_bounds(sizes)
        ]
        held = max(sum(counts[r::nodes]) for r in range(nodes))
        return costing.worker_memory(work, work.params * held / max(sum(counts), 1), note=note)
