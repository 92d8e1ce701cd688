"""Sharded data parallelism (ZeRO, Rajbhandari et al. 2020): each worker keeps 1/N of the state.

Synchronous data parallelism with the replicated state cut into N shards
(:mod:`disttrain.dataparallel.sharding`: flat groups, rank r owns chunk r of each):

- stage 1 (P_os): the optimizer steps only this rank's shard (1/N of the Adam or
  momentum state); gradients are allreduced per fusion group during backward
  as the allreduce strategy does; after the step every group's parameters are
  all-gathered (reduce-scatter + all-gather bytes = one allreduce's);
- stage 2 (P_os+g): each group is reduce-scattered during backward instead, and
  only this rank's chunk of the gradient is kept;
- stage 3 (P_os+g+p): each layer's full weights exist only while it computes:
  all-gathered before its forward and its backward, freed after, the next
  layer's gather prefetched (:mod:`disttrain.dataparallel.gather`).

The step is exactly the replicated one for elementwise optimizers (sgd,
momentum, adam): each element's update reads only its own gradient and state.
``--accumulate K`` runs K micro-batches with communication after the last only.
Under fp16 the shard gradients are unscaled after the reduction and overflow is
agreed over every worker (``communicates_during_backward``).

The mechanics live in :class:`~disttrain.dataparallel.zero.ZeroEngine`, which
``dt.ShardedOptimizer`` / ``dt.shard_model`` drive too. A checkpoint holds each
rank's shards (stage 3: and only the model's buffers, its parameters being
shards); :meth:`Zero.reshard` re-cuts them for another number of workers.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from disttrain import collectives, costing
from disttrain.comm.errors import UsageError
from disttrain.config import RunConfig, opt, register_section
from disttrain.dataparallel.accumulate import accumulated_forward_backward
from disttrain.dataparallel.broadcast import broadcast_tensors
from disttrain.dataparallel.fusion import MB, FlatBucket
from disttrain.dataparallel.gather import layer_units
from disttrain.dataparallel.zero import (
    ZeroEngine,
    check_shard_state,
    group_numels,
    recut_optimizer_state,
    recut_shard_state,
)
from disttrain.strategies.allreduce import AllReduce, DataParallelConfig
from disttrain.strategies.base import Strategy, average_states, register

if TYPE_CHECKING:
    from disttrain.strategies.runspec import RunSpec

__all__ = ["Zero", "ZeroConfig"]


@register_section
@dataclass(frozen=True)
class ZeroConfig:
    """Settings of sharded data parallelism (ZeRO)."""

    zero_stage: int = opt(
        1, "ZeRO stage: 1 shards optimizer state, 2 also gradients, 3 also parameters"
    )

    def validate(self) -> None:
        if self.zero_stage not in (1, 2, 3):
            raise UsageError(f"--zero-stage must be 1, 2 or 3, got {self.zero_stage}")


def _halves(algorithm: str, gradient_bytes: int, nodes: int) -> tuple[float, float]:
    """(reduce-scatter, all-gather): each half's share of the algorithm's whole allreduce,
    in bytes sent, as the algorithm's own costs give them (``ring``: half each)."""
    algo, probe = collectives.get(algorithm), max(gradient_bytes, 1)
    whole = max(algo.cost(probe, nodes).bytes_sent, 1)
    rs = algo.reduce_scatter_cost(probe, nodes).bytes_sent / whole  # shares of it
    ag = algo.all_gather_cost(probe, nodes).bytes_sent / whole
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


@register
class Zero(Strategy):
    """ZeRO stages 1-3 over ``--algorithm``'s reduce-scatter, allreduce and all-gather."""

    name = "zero"
    reads_settings = (ZeroConfig, DataParallelConfig, "algorithm")
    # The shard gradients exist only after the reduction: under fp16 the trainer unscales
    # them (and agrees on overflow) after after_backward, for every stage.
    communicates_during_backward = True
    main_setting: ClassVar[str | None] = "zero_stage"
    # Stages 1 and 2 reduce and gather per fusion group: fewer, larger groups (DDP's
    # default bucket is 25 MB too) measured faster than the allreduce strategy's 4 MB
    # on the default model (benchmarks/RESULTS.md, "Sharded data parallelism")
    setting_defaults: ClassVar[dict[str, Any]] = {"fusion_mb": 25.0}

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        super().setup(model, optimizer)
        if self.world.world_size > 1:
            broadcast_tensors(list(model.state_dict().values()), 0, self.worker_group)
        self.stage = self.config.section(ZeroConfig).zero_stage
        dp: DataParallelConfig = self.config.section(DataParallelConfig)
        self.accumulate = dp.accumulate
        params = list({id(p): p for p in model.parameters() if p.requires_grad}.values())
        self.engine = ZeroEngine.build(
            model,
            params,
            self.stage,
            self.config.train.algorithm,
            dp.overlap,
            self.worker_group,
            int(dp.fusion_mb * MB),
        )
        self.engine.point(optimizer)
        # the names of the parameters that exist only as shards between steps (stage 3)
        sharded = {id(p) for p in self.engine.params()} if self.stage == 3 else set()
        self._sharded_names = {name for name, p in model.named_parameters() if id(p) in sharded}

    # --- the step -----------------------------------------------------------------------
    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.engine.begin_step()  # the trainer zeroes the shards' gradients, not these
        if self.accumulate == 1:
            return super().forward_backward(x, y)
        return accumulated_forward_backward(
            self.model, self.loss_fn, x, y, self.accumulate, self.engine.no_sync
        )

    def check_before_send(self, check: Callable[[FlatBucket], None]) -> bool:
        self.engine.reducer.before_send = check
        return True

    def after_backward(self) -> None:
        self.engine.synchronize()

    def after_step(self, step: int) -> None:
        self.engine.finish_step()

    def finish(self) -> None:
        self.engine.close()

    def eval_model(self) -> nn.Module | None:
        return self.engine.full_model(self.model, self.world.rank == 0)

    # --- reporting and state ---------------------------------------------------------------
    def memory(self) -> dict[str, int]:
        return {**super().memory(), "gathered_peak": self.engine.gathered_peak}

    def summary(self) -> dict[str, Any]:
        return {
            "zero": {
                "stage": self.stage,
                "accumulate": self.accumulate,
                **self.engine.reducer.stats(),
            }
        }

    def state_dict(self) -> dict[str, Any]:
        # This rank's shards (the trainer's optimizer entry holds its optimizer shard).
        return self.engine.shard_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        try:
            self.engine.load_shard_state(state)
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    def replicated_state(self) -> set[str]:
        # stages 1, 2: the parameters, gathered after every step, are equal on every worker
        # (the optimizer's state is sharded already); stage 3 keeps shards only
        if self._sharded_names:
            return set()
        return {f"/model/{name}" for name, _ in self.model.named_parameters()}

    def model_state_dict(self) -> dict[str, Any]:
        """Stage 3: the model's buffers only (its parameters are the shards, in ``state_dict``)."""
        whole = self.model.state_dict()
        return {k: v for k, v in whole.items() if k not in self._sharded_names}

    def load_model_state_dict(self, state: dict[str, Any]) -> None:
        if not self._sharded_names:  # stages 1, 2: the full parameters, replicated
            self.model.load_state_dict(state)
            return
        result = self.model.load_state_dict(state, strict=False)
        if result.unexpected_keys or set(result.missing_keys) != self._sharded_names:
            raise UsageError(
                "the checkpoint's model entry is not a ZeRO stage 3 one (buffers only): "
                "resume with the --zero-stage it was written with"
            )

    @classmethod
    def check_resume(cls, config: RunConfig, model: nn.Module, state: dict[str, Any]) -> None:
        """The checkpoint must hold shards of this stage over the groups this run makes."""
        stage = config.section(ZeroConfig).zero_stage
        fusion = int(config.section(DataParallelConfig).fusion_mb * MB)
        try:
            check_shard_state(
                state.get("strategy") or {}, stage, group_numels(model, stage, fusion)
            )
        except ValueError as exc:
            raise UsageError(f"--resume: {exc}") from None

    reshards = True

    @classmethod
    def reshard(
        cls, read: Callable[[int], dict[str, Any]], old_world: int, rank: int, world: int
    ) -> dict[str, Any]:
        """Rank ``rank`` of ``world`` from ``old_world`` ranks' shards: every group's shards
        (and elementwise optimizer state) put end to end and cut again for ``world``
        ranks (uneven chunks as ever); the replicated rest (the model entry: full
        parameters in stages 1 and 2, buffers in stage 3; RNG; loss scale) is the
        average of the old ranks' (:func:`average_states`: equal replicas kept exactly)."""
        states = [read(j) for j in range(old_world)]
        merged = average_states(
            [{k: v for k, v in s.items() if k not in ("strategy", "optimizer")} for s in states]
        )
        merged["strategy"] = recut_shard_state([s["strategy"] for s in states], world, rank)
        merged["optimizer"] = recut_optimizer_state([s["optimizer"] for s in states], world, rank)
        return merged

    # --- the cost model (``disttrain advise``): step time and memory ---------------------
    cost_settings: ClassVar[tuple[str, ...]] = ("zero_stage", "algorithm", "fusion_mb", "overlap")

    @classmethod
    def advise_specs(cls) -> list[str]:
        return [f"{cls.name}:{stage}" for stage in (1, 2, 3)]

    @classmethod
    def predict(
        cls,
        spec: RunSpec,
        work: costing.Workload,
        nodes: int,
        network: costing.Network,
        calibration: costing.Rates,
    ) -> costing.Prediction:
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
        stage = spec.config().section(ZeroConfig).zero_stage
        ar = AllReduce.predict(spec, work, nodes, network, calibration)
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

    @classmethod
    def predict_memory(
        cls, spec: RunSpec, work: costing.Workload, nodes: int, model: nn.Module
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
