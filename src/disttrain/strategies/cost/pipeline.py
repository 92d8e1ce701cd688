"""The pipeline's cost: the schedule's bubble and the stage hand-offs, and a stage's memory."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from torch import nn

from disttrain import costing
from disttrain.parallel import chain as chains
from disttrain.parallel import placement
from disttrain.parallel.pipeline import schedule
from disttrain.parallel.settings import ParallelConfig
from disttrain.strategies.cost.base import Mesh, StrategyCost, mesh_settings

if TYPE_CHECKING:
    from disttrain.strategies.runspec import RunSpec

__all__ = ["PipelineCost"]


def _cut(pc: ParallelConfig, cuts: int, paths: tuple[str, ...] | None) -> list[int] | None:
    """Layers per stage: at ``--split-points`` (module paths of the model's chain, ``paths``)
    or as a ``--balance`` list; None for the equal cut (``params``, and ``time``, which only
    training measures)."""
    if pc.split_at:
        if paths is None:
            raise ValueError(
                "split_points= names the model's modules: give advise --model (a chain: an "
                "nn.Sequential or a transformers causal LM)"
            )
        return chains.split_sizes(paths, pc.split_at, cuts, "--nodes")
    spec = pc.balance_spec()
    return spec if isinstance(spec, list) else None


def _stage_shares(
    pc: ParallelConfig, ranks: int, chunks: int, work: costing.Workload
) -> list[float] | None:
    """Each model stage's share of the work under a cut (:func:`_cut`): its layers' share of
    the dense parameters where the model is known (``layer_params``: dense layers compute in
    proportion), else its share of the layers; None for the equal cut."""
    spec = _cut(pc, ranks * chunks, work.layer_paths)
    layer_params = work.layer_params
    if spec is None:
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


def chunks_of(settings: Mapping[str, Any]) -> int:
    """V of a scenario mesh: ``virtual_stages`` as given (1 unstated); ValueError below 1."""
    v = int(settings.get("virtual_stages", 1))
    if v < 1:
        raise ValueError(f"virtual-stages={v} must be at least 1")
    return v


class PipelineCost(StrategyCost):
    """Step time and memory of the pipeline schedules (``advise``)."""

    cost_settings: ClassVar[tuple[str, ...]] = (
        "schedule",
        "microbatches",
        "virtual_stages",
        "balance",
        "split_points",
    )
    assumptions: ClassVar[dict[str, str]] = {
        "activation_bytes": "bytes per sample crossing a stage boundary (else not counted)"
    }

    def mesh(self, settings: Mapping[str, Any], gpus: int) -> Mesh:
        """``pipeline``: one stage per GPU (P = G; fewer stages, replicated:
        ``hybrid:pp=P``); ``virtual_stages=V``: V model chunks per stage (interleaved)."""
        mesh_settings(self.name, settings, ("virtual_stages",))
        return Mesh(1, pp=gpus, vp=chunks_of(settings))

    def advise_specs(self) -> list[str]:
        """One row per schedule family: 1F1B, interleaved (V = 2), ZB-H1, ZB-H2."""
        return [
            f"{self.name}:1f1b",
            f"{self.name}:interleaved:virtual_stages=2",
            f"{self.name}:zb1",
            f"{self.name}:zb2",
        ]

    def predict(self, q: costing.Question) -> costing.Prediction:
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
        spec, work, nodes, network, calibration = q
        pc = spec.config().section(ParallelConfig)
        kind = schedule.SCHEDULES.get(pc.schedule)
        p, v = nodes, pc.chunks
        m = _runnable_microbatches(spec, pc, kind, p, v)
        net, cal = network, calibration
        busy = work.batch_size * work.flops * cal.seconds_per_flop / p
        shares = _stage_shares(pc, p, v, work)
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
        cut = f"split at {','.join(pc.split_at)}" if pc.split_at else f"{pc.balance} layers"
        note = "equal stages" if shares is None else f"stages of {cut}"
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

    def predict_memory(
        self, spec: RunSpec, work: costing.Workload, nodes: int, model: nn.Module
    ) -> costing.Memory:
        """One worker per stage (P = nodes; V chunks each where the schedule interleaves),
        cut as training cuts them (``--balance``): the rank with the most parameters holds
        them, their gradients and optimizer state (Adam: 16 bytes each). Activations, the
        schedule's part, are not counted (``summary.json`` ``stage0_peak_activation_bytes``)."""
        pc: ParallelConfig = spec.config().section(ParallelConfig)
        chain = chains.as_chain(model, "pipeline")
        layers = list(chain.layers)
        cuts = nodes * pc.chunks
        if cuts > len(layers):
            raise ValueError(
                f"{cuts} stages need as many layers; the model has {len(layers)} "
                "(its modules in order, activations included)"
            )
        balance = pc.balance_spec()
        note = "--balance time: split as params (training measures the layers)"
        if pc.split_at:
            sizes, note = chains.split_sizes(chain.paths, pc.split_at, cuts, "--nodes"), ""
        elif isinstance(balance, list):
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
        # scaled to the workload's parameters by the model's own (each counted once: a tied
        # weight is held, and counted, on each stage that uses it)
        whole = sum(p.numel() for p in chain.layers.parameters())
        return costing.worker_memory(work, work.params * held / max(whole, 1), note=note)
