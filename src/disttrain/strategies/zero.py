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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from disttrain import collectives
from disttrain.comm.errors import UsageError
from disttrain.config import RunConfig, opt, register_section
from disttrain.dataparallel.broadcast import broadcast_tensors
from disttrain.dataparallel.buffers import broadcast_buffers
from disttrain.dataparallel.fusion import MB, FlatBucket
from disttrain.dataparallel.gather_units import check_units
from disttrain.dataparallel.zero import (
    ZeroEngine,
    check_shard_state,
    group_numels,
    recut_optimizer_state,
    recut_shard_state,
)
from disttrain.strategies.allreduce import DataParallelConfig
from disttrain.strategies.base import Strategy, register
from disttrain.strategies.capabilities import (
    Accumulates,
    CountsMemory,
    Reshards,
    SendsDuringBackward,
    ShapesCheckpoint,
    StepEvents,
    replica_memory,
)
from disttrain.strategies.settings import StrategySettings
from disttrain.strategies.state import average_states

__all__ = ["Zero", "ZeroConfig", "ZeroSettings"]


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


class ZeroSettings(StrategySettings):
    """What ZeRO reads (its stage, the data-parallel engine's section, --algorithm), and the
    check that a checkpoint holds shards of this run's stage and groups."""

    reads_settings = (ZeroConfig, DataParallelConfig, "algorithm")
    main_setting: ClassVar[str | None] = "zero_stage"
    # Stages 1 and 2 reduce and gather per fusion group: fewer, larger groups (DDP's
    # default bucket is 25 MB too) measured faster than the allreduce strategy's 4 MB
    # on the default model (benchmarks/RESULTS.md, "Sharded data parallelism")
    # --algorithm auto: the cost model's table picks each bucket's halves (docs/collectives.md)
    setting_defaults: ClassVar[dict[str, Any]] = {"fusion_mb": 25.0, "algorithm": "auto"}

    @classmethod
    def validate_config(cls, config: RunConfig, model: nn.Module) -> None:
        """The batch splits over the workers, and stage 3 can shard the model's units
        (one dtype and device a unit, ...: ``gather_units.check_units``), before any
        process starts."""
        super().validate_config(config, model)
        if config.section(ZeroConfig).zero_stage == 3:
            check_units(model)

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


# SendsDuringBackward: the shard gradients exist only after the reduction, so under fp16 the
# trainer unscales them (and agrees on overflow) after after_backward, for every stage.
@register(settings=ZeroSettings, cost="disttrain.strategies.cost.zero:ZeroCost")
class Zero(
    Strategy,
    Accumulates,
    Reshards,
    ShapesCheckpoint,
    SendsDuringBackward,
    StepEvents,
    CountsMemory,
):
    """ZeRO stages 1-3 over ``--algorithm``'s reduce-scatter, allreduce and all-gather."""

    name = "zero"

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        super().setup(model, optimizer)
        if self.world.world_size > 1:
            broadcast_tensors(list(model.state_dict().values()), 0, self.roles.worker_group)
        self.stage = self.config.section(ZeroConfig).zero_stage
        dp: DataParallelConfig = self.config.section(DataParallelConfig)
        self.accumulate = dp.accumulate
        params = list({id(p): p for p in model.parameters() if p.requires_grad}.values())
        self.engine = ZeroEngine.build(
            model,
            params,
            self.stage,
            # configured by its own settings section (hierarchical's --inter-algorithm)
            collectives.build(self.config.train.algorithm, self.config),
            dp.overlap,
            self.roles.worker_group,
            int(dp.fusion_mb * MB),
        )
        self.engine.point(optimizer)
        # the names of the parameters that exist only as shards between steps (stage 3)
        sharded = {id(p) for p in self.engine.params()} if self.stage == 3 else set()
        self._sharded_names = {name for name, p in model.named_parameters() if id(p) in sharded}

    # --- the step -----------------------------------------------------------------------
    def before_step(self, step: int) -> None:
        # before any forward of the step (the trainer's, or a user's own with
        # run.backward): the trainer zeroes the shards' gradients, not these
        self.engine.begin_step()
        # DDP's broadcast_buffers: rank 0's BatchNorm statistics on every replica (buffers
        # are never sharded, at any stage); nothing sent for a model without them
        broadcast_buffers(self.model, 0, self.roles.worker_group)

    def skipped_step(self, step: int) -> None:
        del step  # an agreed fp16 skip: the next before_step drops this step's gradients

    def no_sync(self) -> Any:
        return self.engine.no_sync()

    def check_before_send(self, check: Callable[[FlatBucket], None]) -> bool:
        self.engine.reducer.before_send = check
        return True

    def after_backward(self) -> None:
        self.engine.synchronize()

    def after_step(self, step: int) -> None:
        self.engine.finish_step()

    def finish(self) -> None:
        broadcast_buffers(self.model, 0, self.roles.worker_group)  # the evaluated: rank 0's
        self.engine.close()

    def eval_model(self) -> nn.Module | None:
        return self.engine.full_model(self.model, self.world.rank == 0)

    # --- reporting and state ---------------------------------------------------------------
    def memory(self) -> dict[str, int]:
        held = replica_memory(self.model, self.optimizer)
        return {**held, "gathered_peak": self.engine.gathered_peak}

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
