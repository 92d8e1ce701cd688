"""The mesh's cost part: a replica's stage or slice memory (its step time is not modelled)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from torch import nn

from disttrain import costing
from disttrain.parallel.settings import ParallelConfig
from disttrain.strategies.cost.base import Mesh, StrategyCost, mesh_settings
from disttrain.strategies.cost.pipeline import PipelineCost, chunks_of
from disttrain.strategies.cost.tensor import TensorCost
from disttrain.strategies.hybrid import mesh_shape

if TYPE_CHECKING:
    from disttrain.strategies.runspec import RunSpec

__all__ = ["HybridCost"]


class HybridCost(StrategyCost):
    """The memory of a replica's stage or slice (``advise``: name the mesh, hybrid:pp=4)."""

    not_modelled: ClassVar[str] = (
        "its replicas are pipelines or tensor-parallel groups, which are not modelled"
    )
    cost_settings: ClassVar[tuple[str, ...]] = (
        "dp",
        "pp",
        "tp",
        "schedule",
        "virtual_stages",
        "balance",
        "tensor_mode",
    )

    def mesh(self, settings: Mapping[str, Any], gpus: int) -> Mesh:
        """``hybrid:tp=T:pp=P[:dp=D][:virtual_stages=V]`` (``--tp``, ``--pp``, ``--dp``,
        ``--virtual-stages``): D replicas of T slices by P stages, V chunks a stage. T and P
        together (3D, which ``disttrain train`` does not run) are the scenario model's; one
        unstated (or 0) is 1, D unstated (or 0) is G / (T·P); at least one of T and P given."""
        mesh_settings(self.name, settings, ("tp", "pp", "dp", "virtual_stages"))
        if not settings.get("tp") and not settings.get("pp"):
            raise ValueError("hybrid needs tp=T or pp=P (ranks inside each replica)")
        tp, pp = settings.get("tp") or 1, settings.get("pp") or 1
        if not settings.get("dp") and gpus % (tp * pp):
            raise ValueError(f"tp*pp = {tp * pp} does not divide the {gpus} GPUs")
        dp = settings.get("dp") or gpus // (tp * pp)
        if dp * tp * pp != gpus:
            raise ValueError(f"dp*tp*pp = {dp * tp * pp}, not the {gpus} GPUs")
        return Mesh(dp, tp, pp, chunks_of(settings))

    def predict_memory(
        self, spec: RunSpec, work: costing.Workload, nodes: int, model: nn.Module
    ) -> costing.Memory:
        """A replica's stage or slice: the pipeline's or tensor slicing's formula on the
        mesh's inner ranks (every replica holds the same)."""
        pc: ParallelConfig = spec.config().section(ParallelConfig)
        _, inner, kind = mesh_shape(pc, nodes)
        within = PipelineCost(self.name) if kind == "pp" else TensorCost(self.name)
        return within.predict_memory(spec, work, inner, model)
