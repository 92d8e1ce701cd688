"""Synchronous data parallelism: fused gradient buckets averaged by an allreduce, during backward.

N workers at global batch B then take exactly the steps one process takes at
batch B: each worker's loss is the mean over its B/N samples, so the mean of
the N gradients is the gradient of the mean loss over all B. With
``--accumulate K`` each worker splits its shard into K micro-batches, weights
each loss by its share of the shard, and communicates only after the last one:
still one step of the same global batch, with 1/K of the activation memory.
The mechanics (buckets, hooks, the communication thread) live in
:mod:`disttrain.dataparallel.reducer`.

``--compression fp16|bf16`` (a cast) sends the same fused buckets in 16 bits,
overlapped as usual: the one spelling of 16-bit gradients. A sparse compressor
(``topk:R``, ``onebit:T``) instead exchanges one compressed payload with every
peer after backward, with error feedback: it reads neither ``--fusion-mb``,
``--overlap`` nor ``--accumulate`` (nor ``--algorithm``, unless its payloads are
summable), and pre-flight refuses them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from disttrain import collectives, timeline
from disttrain.comm.errors import UsageError
from disttrain.comm.world import World
from disttrain.compression.base import Configurable, LayerAware, Stateful
from disttrain.compression.casts import cast_dtype
from disttrain.compression.config import CompressionConfig
from disttrain.compression.error_feedback import ErrorFeedback
from disttrain.compression.exchange import (
    CompressionStats,
    compressed_all_reduce,
    compression_figures,
)
from disttrain.compression.registry import parse, section_of, sections
from disttrain.compression.starved import StarvedCheck
from disttrain.config import RunConfig, field_names, opt, register_section
from disttrain.dataparallel.average import average
from disttrain.dataparallel.broadcast import broadcast_tensors
from disttrain.dataparallel.buffers import broadcast_buffers
from disttrain.dataparallel.fusion import FlatBucket
from disttrain.dataparallel.reducer import Reducer
from disttrain.strategies.base import Strategy, register
from disttrain.strategies.capabilities import (
    Accumulates,
    Grows,
    Reshards,
    SendsDuringBackward,
    ShapesCheckpoint,
    StepEvents,
)
from disttrain.strategies.settings import StrategySettings

__all__ = ["AllReduce", "AllReduceSettings", "DataParallelConfig", "broadcast_tensors"]

#: The --fusion-mb default, chosen by `disttrain bench dp --sweep` (docs/data-parallel.md).
DEFAULT_FUSION_MB = 4.0


@register_section
@dataclass(frozen=True)
class DataParallelConfig:
    """Settings of the synchronous data-parallel engine (tensor fusion, overlap, accumulation)."""

    fusion_mb: float = opt(
        DEFAULT_FUSION_MB, "tensor fusion: gradient bucket size in MB (0: one allreduce per tensor)"
    )
    overlap: bool = opt(True, "start each bucket's allreduce during backward, once it is full")
    accumulate: int = opt(1, "micro-batches per optimizer step (accumulation), one allreduce")

    def validate(self) -> None:
        if self.fusion_mb < 0:
            raise UsageError(f"--fusion-mb must be >= 0, got {self.fusion_mb}")
        if self.accumulate < 1:
            raise UsageError(f"--accumulate must be >= 1, got {self.accumulate}")


class AllReduceSettings(StrategySettings):
    """What the allreduce strategy reads: the engine's section, the compressors', --algorithm."""

    # the compressors' own sections too (--powersgd-start-step), each read with its compressor
    reads_settings = (DataParallelConfig, CompressionConfig, "algorithm", *sections())
    main_setting: ClassVar[str | None] = "algorithm"
    # a sparse compressor takes the other path (one payload per peer after backward)
    modes: ClassVar[dict[str, tuple[str, ...]]] = {
        "": (),
        "topk": ("--compression", "topk:0.01"),
    }

    @classmethod
    def defaults_for(cls, settings: Mapping[str, Any]) -> dict[str, Any]:
        """``--algorithm auto`` (the cost model's table, docs/collectives.md) wherever the
        run allreduces: not with a compressor whose payloads go to each peer instead."""
        spec = str(settings.get("compression", "none"))
        try:
            summable = parse(spec).summable
        except UsageError:  # the compression setting's own check names it
            return {}
        return {"algorithm": "auto"} if summable else {}

    @classmethod
    def settings_not_read(cls, config: RunConfig) -> dict[str, str]:
        spec = config.section(CompressionConfig).compression
        compressor = parse(spec)
        own = section_of(spec)
        others = [s for s in sections() if s is not own]
        unread = dict.fromkeys(field_names(tuple(others)), f"with --compression {spec}")
        if cast_dtype(compressor) is not None:  # the reducer's buckets, cast: nothing left out
            why = "nothing is compressed" if spec == "none" else "a cast leaves nothing out"
            return {**unread, "error_feedback": f"with --compression {spec} ({why})"}
        why = f"with --compression {spec} (one payload per peer after backward, unfused)"
        unread.update(dict.fromkeys(("fusion_mb", "overlap", "accumulate"), why))
        if not compressor.summable:  # sent to every peer point to point, no allreduce
            unread["algorithm"] = why
        return unread

    @classmethod
    def validate_config(cls, config: RunConfig, model: nn.Module) -> None:
        super().validate_config(config, model)
        spec = config.section(CompressionConfig).compression
        if config.train.live_shrink and cast_dtype(parse(spec)) is None:
            raise UsageError(
                f"--min-workers with --compression {spec}: a failed step's error feedback "
                "cannot be rolled back; use --compression none, fp16 or bf16"
            )
        if config.train.live_grow and cast_dtype(parse(spec)) is None:
            raise UsageError(
                f"--max-workers with --compression {spec}: a joiner has no error feedback "
                "of its own to go on from; use --compression none, fp16 or bf16"
            )


# Grows: live shrink (--min-workers) regroups the survivors and redoes the step, live grow
# (--max-workers) gives a joiner rank 0's replica over the new group (``regroup``).
# Reshards: replicas are equal, so a resume on M workers takes them as they are; per-worker
# error feedback residuals are averaged (their mean is what the next average adds back).
# SendsDuringBackward: buckets may be summed during backward, so under fp16 the trainer
# unscales after the sum (a sum carries any rank's Inf/NaN to all); also with --no-overlap.
# StepEvents: rank 0's BatchNorm statistics broadcast as each step begins (DDP's buffers).
@register(settings=AllReduceSettings, cost="disttrain.strategies.cost.allreduce:AllReduceCost")
class AllReduce(
    Strategy, Accumulates, Grows, Reshards, ShapesCheckpoint, SendsDuringBackward, StepEvents
):
    """Average gradients with ``--algorithm``, fused into buckets, overlapped with backward."""

    name = "allreduce"

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        super().setup(model, optimizer)
        if self.world.world_size > 1:
            broadcast_tensors(list(model.state_dict().values()), 0, self.roles.worker_group)
        cc = self.config.section(CompressionConfig)
        compressor = parse(cc.compression)
        self.accumulate = 1
        self.compressor = None if cast_dtype(compressor) is not None else compressor
        if self.compressor is not None:
            # Compressed payloads are summed after backward (sparse ones are all-gathered
            # and decoded), so the step runner unscales fp16 gradients before sending.
            self.communicates_during_backward = False
            if isinstance(self.compressor, Configurable):
                self.compressor.configure(self.config)
            self.feedback = ErrorFeedback(self.compressor, enabled=cc.error_feedback)
            self.stats = CompressionStats(starved=StarvedCheck(self.compressor))
            # only summable payloads ride an allreduce; the others go to every peer
            self.algorithm: collectives.Algorithm = (
                collectives.build(self.config.train.algorithm, self.config)
                if self.compressor.summable
                else "native"
            )
            return
        self.accumulate = self.config.section(DataParallelConfig).accumulate
        self.reducer = self._reducer()

    def _reducer(self) -> Reducer:
        dp: DataParallelConfig = self.config.section(DataParallelConfig)
        return Reducer(
            list(self.model.parameters()),
            # configured by its own settings section (hierarchical's --inter-algorithm)
            algorithm=collectives.build(self.config.train.algorithm, self.config),
            fusion_mb=dp.fusion_mb,
            overlap=dp.overlap,
            group=self.roles.worker_group,
            world_size=self.world.world_size,
            # a cast: the buckets travel in its type
            compression=self.config.section(CompressionConfig).compression,
        )

    def before_step(self, step: int) -> None:
        # torch DDP's broadcast_buffers=True: every replica's forward starts from rank 0's
        # running statistics (the parameters are equal already); one message per dtype,
        # none for a model without floating buffers. Once per step, before the first
        # micro-batch, as DDP (its no_sync forwards skip the broadcast).
        broadcast_buffers(self.model, 0, self.roles.worker_group)

    def skipped_step(self, step: int) -> None:
        del step  # nothing to undo: the next before_step broadcasts rank 0's again

    def abandon_step(self) -> None:
        if self.compressor is None:
            self.reducer.abandon()

    def regroup(self, world: World) -> None:
        """Replicas are equal: only the reducer's buckets (scaled by 1/n), hooks and groups
        are remade for the survivors; the check before sending carries over."""
        self.world = world
        check = self.reducer.before_send
        self.reducer.close()
        self.reducer = self._reducer()
        self.reducer.before_send = check

    def no_sync(self) -> Any:
        """Backward passes inside accumulate locally; the next one outside communicates."""
        return self.reducer.no_sync()

    def check_before_send(self, check: Callable[[FlatBucket], None]) -> bool:
        if self.compressor is not None:  # compressed payloads are sent after backward
            return False
        self.reducer.before_send = check
        return True

    def after_backward(self) -> None:
        if self.compressor is not None:
            with timeline.span("compressed allreduce", compression=self.compressor.spec):
                self._compressed_average()
            return
        # With overlap, most buckets are already on the wire; this waits for the rest.
        self.reducer.synchronize()

    def _compressed_average(self) -> None:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        compressor = self.compressor
        assert compressor is not None
        if isinstance(compressor, LayerAware):  # per-layer compressors (low rank)
            compressor.bind_shapes([g.shape for g in grads])

        def compressed_mean(flat: torch.Tensor) -> None:
            compressed_all_reduce(
                flat,
                compressor,
                self.algorithm,
                self.roles.worker_group,
                self.feedback,
                self.stats,
                mean=True,
            )

        average(
            grads,
            group=self.roles.worker_group,
            world_size=self.world.world_size,
            mean_=compressed_mean,
        )

    def finish(self) -> None:
        # the last forward moved each rank's statistics its own way: rank 0's, everywhere
        broadcast_buffers(self.model, 0, self.roles.worker_group)
        if self.compressor is None:
            self.reducer.close()

    def step_metrics(self) -> dict[str, Any]:
        if self.compressor is None:
            return {}
        return {
            **compression_figures(self.stats),
            "residual_norm": self.feedback.residual_norm(),
            **(self.compressor.figures() if isinstance(self.compressor, Stateful) else {}),
        }

    def summary(self) -> dict[str, Any]:
        if self.compressor is not None:
            return self.step_metrics()
        stats = self.reducer.stats()
        return {"data_parallel": {**stats, "accumulate": self.accumulate}}

    def replicated_state(self) -> set[str]:
        # every worker applies the same averaged gradient (the collectives hand every rank
        # the same bytes) from the same start, so parameters and optimizer state are equal;
        # buffers (BatchNorm's statistics) are rank 0's before each forward, each
        # worker's own after it (as DDP's): not shared
        return {"/optimizer"} | {f"/model/{name}" for name, _ in self.model.named_parameters()}

    def state_dict(self) -> dict[str, Any]:
        if self.compressor is None:
            return {}
        own = self.compressor.state_dict() if isinstance(self.compressor, Stateful) else {}
        return {"feedback": self.feedback.state_dict(), "compressor": own}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.compressor is not None and state:
            self.feedback.load_state_dict(state.get("feedback", {}))
            if isinstance(self.compressor, Stateful):
                self.compressor.load_state_dict(state.get("compressor", {}))
