"""The mesh's cost part: a replica's stage or slice memory (its step time is not modelled)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from torch import nn

from disttrain import costing
from disttrain.parallel.settings import ParallelConfig
from disttrain.strategies.cost.base import StrategyCost
from disttrain.strategies.cost.pipeline import PipelineCost
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

    def predict_memory(
        self, spec: RunSpec, work: costing.Workload, nodes: int, model: nn.Module
    ) -> costing.Memory:
        """A replica's stage or slice: the pipeline's or tensor slicing's formula on the
        mesh's inner ranks (every replica holds the same)."""
        pc: ParallelConfig = spec.config().section(ParallelConfig)
        _, inner, kind = mesh_shape(pc, nodes)
        within = PipelineCost(self.name) if kind == "pp" else TensorCost(self.name)
        return within.predict_memory(spec, work, inner, model)
