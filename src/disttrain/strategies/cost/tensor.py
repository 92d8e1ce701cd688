"""Tensor slicing's cost part: a slice's memory (its step time is not modelled)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from torch import nn

from disttrain import costing
from disttrain.parallel import placement, tensor
from disttrain.parallel.settings import ParallelConfig
from disttrain.strategies.cost.base import Mesh, StrategyCost, mesh_settings

if TYPE_CHECKING:
    from disttrain.strategies.runspec import RunSpec

__all__ = ["TensorCost"]


class TensorCost(StrategyCost):
    """The memory of one slice (``advise``)."""

    not_modelled: ClassVar[str] = (
        "its step depends on the activations exchanged inside every layer, which a "
        "parameter count does not give"
    )
    cost_settings: ClassVar[tuple[str, ...]] = ("tensor_mode",)

    def memory_specs(self) -> list[str]:
        return [self.name]

    def mesh(self, settings: Mapping[str, Any], gpus: int) -> Mesh:
        """``tensor``: one model sliced over all the GPUs, Megatron-LM's column-then-row
        pairs (T = G; fewer slices, replicated: ``hybrid:tp=T``)."""
        mesh_settings(self.name, settings, ())
        return Mesh(1, tp=gpus)

    def predict_memory(
        self, spec: RunSpec, work: costing.Workload, nodes: int, model: nn.Module
    ) -> costing.Memory:
        """Each of the T = nodes workers holds 1/T of every Linear layer ``tensor.plan``
        splits (a row-parallel layer's bias whole) and all of every other layer, with their
        gradients and optimizer state. Activations are not counted."""
        pc: ParallelConfig = spec.config().section(ParallelConfig)
        layers = placement.check_sequential(model, "tensor")
        kinds = tensor.plan(layers, nodes, pc.tensor_mode)
        if nodes > 1 and all(k == "rep" for k in kinds):
            raise ValueError(f"no Linear layer of the model splits into {nodes} slices")
        held = 0.0
        for layer, kind in zip(layers, kinds, strict=True):
            for name, p in layer.named_parameters():
                whole = kind == "rep" or (kind == "row" and name == "bias")
                held += p.numel() if whole else p.numel() / nodes
        total = sum(p.numel() for layer in layers for p in layer.parameters())
        return costing.worker_memory(work, work.params * held / max(total, 1))
