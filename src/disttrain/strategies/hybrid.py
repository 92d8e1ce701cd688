"""A process mesh: data parallelism across D replicas, pipeline or tensor parallelism inside.

``--dp D --pp P``: D pipelines of P stages; ``--dp D --tp T``: D groups of T
tensor shards. Each replica takes 1/D of every global batch; after backward,
each stage (or shard) averages its gradients with the same stage of the other
replicas, in its dp group, with ``--algorithm`` over one flat buffer (the
whole stage fused into one message). D·P (or D·T) must equal the worker count.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from disttrain import collectives, timeline
from disttrain.comm import phases
from disttrain.comm.errors import UsageError
from disttrain.comm.meter import meter
from disttrain.comm.world import World
from disttrain.config import RunConfig
from disttrain.dataparallel.average import average
from disttrain.parallel.mesh import Mesh
from disttrain.parallel.settings import ParallelConfig
from disttrain.strategies.base import LossFn, Strategy, register
from disttrain.strategies.capabilities import ShardsData
from disttrain.strategies.pipeline import (
    Pipeline,
    PipelineSettings,
    check_pipeline,
    pipeline_settings_not_read,
)
from disttrain.strategies.settings import StrategySettings
from disttrain.strategies.tensor import TensorParallel, check_tensor, tensor_settings_not_read

__all__ = ["Hybrid", "HybridSettings", "mesh_shape"]


def mesh_shape(pc: ParallelConfig, workers: int) -> tuple[int, int, str]:
    """(D, K, "pp" or "tp") of the mesh, or UsageError naming the number to change."""
    if not pc.pp and not pc.tp:
        raise UsageError("--strategy hybrid needs --pp P or --tp T (ranks inside each replica)")
    kind, inner = ("pp", pc.pp) if pc.pp else ("tp", pc.tp)
    dp = pc.dp or workers // inner
    if dp < 1 or dp * inner != workers:
        raise UsageError(
            f"--dp {dp} x --{kind} {inner} = {dp * inner} ranks, but there are {workers} workers: "
            f"set --workers {dp * inner}, or make --dp x --{kind} = {workers}"
        )
    return dp, inner, kind


class HybridSettings(StrategySettings):
    """What the mesh reads: the parallel section (its pipeline's or slices' settings as its
    inner kind reads them) and --algorithm (the replicas' gradient average)."""

    reads_settings = (ParallelConfig, "algorithm")
    # it requires --pp or --tp (ranks inside each replica)
    modes: ClassVar[dict[str, tuple[str, ...]]] = {"tp": ("--tp", "2")}

    @classmethod
    def settings_not_read(cls, config: RunConfig) -> dict[str, str]:
        pc: ParallelConfig = config.section(ParallelConfig)
        unread = {"stages": "(the mesh sets the stages: --pp)"}
        # the pipeline's own settings but its stage count, which the mesh sets
        pipeline = tuple(n for n in PipelineSettings.reads_settings if n != "stages")
        if pc.pp:
            why = f"with --pp {pc.pp} (pipeline stages inside each replica)"
            unread.update(dict.fromkeys(("tensor_mode", "tp_plan"), why))
            unread.update(pipeline_settings_not_read(pc))
        elif pc.tp:
            why = f"with --tp {pc.tp} (tensor slices inside each replica)"
            unread.update(dict.fromkeys(pipeline, why))
            unread.update(tensor_settings_not_read(pc))
        return unread

    @classmethod
    def validate_config(cls, config: RunConfig, model: nn.Module) -> None:
        pc: ParallelConfig = config.section(ParallelConfig)
        dp, inner, kind = mesh_shape(pc, config.train.world_size)
        per_group = config.train.batch_size // dp
        if config.train.batch_size % dp:
            raise UsageError(
                f"--batch-size {config.train.batch_size} does not split into --dp {dp} "
                f"replicas: use a multiple of {dp}"
            )
        if kind == "pp":
            check_pipeline(model, inner, per_group, pc, "--pp", strategy="hybrid")
        else:
            check_tensor(model, inner, pc, "--tp", strategy="hybrid")


# ShardsData: the replicas (rows of the mesh) split each global batch, not every rank.
@register(
    settings=HybridSettings,
    cost="disttrain.strategies.cost.hybrid:HybridCost",
    shares_activations=True,  # stages or slices exchange activations
)
class Hybrid(Strategy, ShardsData):
    """Data parallel across the rows of the mesh, pipeline or tensor parallel along them."""

    name = "hybrid"

    def __init__(self, config: RunConfig, world: World, loss_fn: LossFn) -> None:
        super().__init__(config, world, loss_fn)
        pc: ParallelConfig = config.section(ParallelConfig)
        self.dp, _, self.kind = mesh_shape(pc, world.world_size)
        self.mesh = Mesh.create(world.world_size, world.rank, self.dp)
        self.inner: Pipeline | TensorParallel

        def scaled(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self.loss_fn(out, y)  # late-bound: fp16 wraps self.loss_fn with the scale

        loss_fn = scaled
        if self.kind == "pp":
            self.inner = Pipeline(config, world, loss_fn)
            self.inner.bind(
                self.mesh.inner_group, self.mesh.inner_ranks, config.train.batch_size // self.dp
            )
        else:
            self.inner = TensorParallel(config, world, loss_fn)
            self.inner.bind(self.mesh.inner_group, self.mesh.inner_ranks)
        self.algorithm = collectives.build(config.train.algorithm, config)

    @property
    def data_rank(self) -> int:
        return self.mesh.dp_index

    @property
    def data_world_size(self) -> int:
        return self.dp

    def prepare_model(self, model: nn.Module, sample: torch.Tensor) -> nn.Module:
        return self.inner.prepare_model(model, sample)

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        super().setup(model, optimizer)
        self.inner.setup(model, optimizer)

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = self.inner.forward_backward(x, y)
        if self.dp > 1 and self.mesh.inner_index == 0:
            # the logged loss: the mean over the replicas' shards (a wait for them: communication)
            with meter.paused(), phases.book(phases.COMMUNICATION):
                loss = loss.detach().reshape(1).clone()
                collectives.all_reduce(loss, "native", self.mesh.dp_group)
                loss = loss[0] / self.dp
        return loss

    def after_backward(self) -> None:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if self.dp == 1 or not grads:
            return
        with timeline.span("allreduce", group="dp"):
            average(grads, self.algorithm, self.mesh.dp_group, world_size=self.dp)

    def eval_model(self) -> nn.Module | None:
        if self.mesh.dp_index != 0:
            return None  # the replicas are equal: replica 0 gathers its stages or shards
        return self.inner.eval_model()

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()  # a pipeline's layout of stages

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)

    def summary(self) -> dict[str, Any]:
        return {"mesh": {"dp": self.dp, self.kind: self.mesh.inner}, **self.inner.summary()}
