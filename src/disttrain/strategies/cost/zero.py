"""ZeRO's cost: the allreduce strategy's buckets cut in halves, and the ZeRO paper's memory."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from torch import nn

from disttrain import collectives, costing
from disttrain.dataparallel.gather import layer_units
from disttrain.strategies.allreduce import DataParallelConfig
from disttrain.strategies.cost.allreduce import AllReduceCost
from disttrain.strategies.cost.base import Mesh, StrategyCost, mesh_settings
from disttrain.strategies.zero import ZeroConfig

if TYPE_CHECKING:
    from disttrain.strategies.runspec import RunSpec

__all__ = ["ZeroCost"]


def _halves(algorithm: str, gradient_bytes: int, nodes: int) -> tuple[float, float]:
    """(reduce-scatter, all-gather): each half's share of the algorithm's whole allreduce,
    in bytes sent, as the algorithm's own costs give them (``ring``: half each)."""
    algo, probe = collectives.get(algorithm), max(gradient_bytes, 1)
    whole = max(algo.cost(probe, nodes).bytes_sent, 1)
    rs = algo.cost(probe, nodes, op="reduce_scatter").bytes_sent / whole  # shares of it
    ag = algo.cost(probe, nodes, op="all_gather").bytes_sent / whole
    return rs, ag


def _stage_comm(
    stage: int, allreduce_comm: float, times: list[float], rs: float, ag: float, backward: float
) -> tuple[float, float]:
    """(exposed communication seconds, bytes as a multiple of the allreduce's) of a stage.

    ``times`` are the buckets' allreduce seconds; what runs during ``backward`` is
    hidden but for its last bucket. Stage 1: the allreduce, then an all-gather;
    stage 2: reduce-scatter behind backward, then an all-gather; stage 3: an
    all-gather for forward (exposed) and the backward's gathers and reduce-scatters.
    """
    total, last = sum(times), (times[-1] if times else 0.0)

    def hidden(total: float, window: float, tail: float) -> float:
        return max(tail, total - window) if window else total

    if stage == 1:
        return allreduce_comm + ag * total, 1 + ag
    if stage == 2:
        return hidden(rs * total, backward, rs * last) + ag * total, rs + ag
    return ag * total + hidden((ag + rs) * total, backward, rs * last), 2 * ag + rs


class ZeroCost(StrategyCost):
    """Step time and memory of ZeRO stages 1-3 (``advise``)."""

    cost_settings: ClassVar[tuple[str, ...]] = ("zero_stage", "algorithm", "fusion_mb", "overlap")

    def advise_specs(self) -> list[str]:
        return [f"{self.name}:{stage}" for stage in (1, 2, 3)]

    def mesh(self, settings: Mapping[str, Any], gpus: int) -> Mesh:
        """``zero:S`` (``--zero-stage S``, its main setting; 1 unstated): every GPU a
        data-parallel rank holding 1/G of what stage S shards."""
        mesh_settings(self.name, settings, ("zero_stage",))
        stage = settings.get("zero_stage", ZeroConfig.zero_stage)
        if stage not in (1, 2, 3):
            raise ValueError(f"zero-stage={stage}: ZeRO stages are 1, 2 and 3")
        return Mesh(gpus, zero=stage)

    def predict(self, q: costing.Question) -> costing.Prediction:
        """The allreduce strategy's buckets, each allreduce cut in its halves, each half
        charged its share of the allreduce by the algorithm's own costs (``ring``: half
        each; ``native``: the reduce-scatter is the whole allreduce, the all-gather half;
        the fallback: a whole allreduce each): stage 1 allreduces during
        backward as the allreduce strategy does, then all-gathers the parameters after the
        step (exposed); stage 2 reduce-scatters during backward, then all-gathers; stage 3
        all-gathers every layer before its forward and again before its backward, with the
        reduce-scatters behind backward (two thirds of compute). Forward's gathers are
        counted exposed: measured, stage 3 is no faster than stage 2 (benchmarks/RESULTS.md,
        ``bench zero``), the prefetch of one layer hiding little on shared cores."""
        spec, work, nodes, network, calibration = q
        stage = spec.config().section(ZeroConfig).zero_stage
        ar = AllReduceCost(self.name).predict(q)
        cfg = spec.config()
        overlap = (
            cfg.section(DataParallelConfig).overlap
            if "overlap" in spec.settings
            else (work.overlap)
        )
        sizes = costing.bucket_sizes(work.gradient_bytes, work.bucket_bytes)
        times = [
            costing.allreduce_seconds(
                cfg.train.algorithm, size, nodes, network, calibration, work.bytes_per_param
            )[0]
            for size in sizes
        ]
        rs, ag = _halves(cfg.train.algorithm, work.gradient_bytes, nodes)
        compute = ar.compute_seconds
        backward = compute * 2 / 3 if overlap else 0.0
        comm, scale = _stage_comm(stage, ar.comm_seconds, times, rs, ag, backward)
        if stage > 1:  # stage 1's is in the allreduce's comm
            comm += calibration.sync_seconds(nodes)
        what = {
            1: "allreduce + all-gather after the step",
            2: "reduce-scatter + all-gather after the step",
            3: "per layer: all-gather for forward and for backward + reduce-scatter",
        }[stage]
        reason = f"stage {stage}: {what}; {ar.reason}"
        return costing.finish(
            spec.label,
            nodes,
            compute,
            comm,
            ar.bytes_per_rank * scale,
            ar.messages_per_rank * scale,
            ar.bound,
            reason,
            work,
            calibration,
        )

    def predict_memory(
        self, spec: RunSpec, work: costing.Workload, nodes: int, model: nn.Module
    ) -> costing.Memory:
        """The ZeRO paper's formulas (Rajbhandari et al. 2020), K the optimizer's state (Adam:
        8Ψ): stage 1 shards the state (Adam: 8Ψ + 8Ψ/N), stage 2 also the gradients
        (4Ψ + 12Ψ/N), stage 3 also the parameters (16Ψ/N), plus the layers gathered at once:
        the largest two neighbours (one computing, the next prefetched). Autocast's weight
        copies are of the whole model at every stage: a gathered layer's bf16 copy stays
        saved for its backward."""
        stage = spec.config().section(ZeroConfig).zero_stage
        psi, shard = work.params, work.params / nodes
        gathered = 0.0
        if stage == 3:
            sizes = [sum(p.numel() for p in params) for _, params in layer_units(model)]
            pair = max((a + b for a, b in itertools.pairwise(sizes)), default=sum(sizes))
            gathered = psi * pair / max(sum(sizes), 1)
        return costing.worker_memory(
            work,
            shard if stage == 3 else psi,
            shard if stage >= 2 else psi,
            shard,
            gathered,
            computed=psi,
        )
