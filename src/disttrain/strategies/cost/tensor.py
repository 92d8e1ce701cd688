"""Tensor slicing's cost part: a slice's memory (its step time is not modelled)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from torch import nn

from disttrain import costing
from disttrain.parallel import placement, plan, tensor, tp_modules
from disttrain.parallel.settings import ParallelConfig
from disttrain.strategies.cost.base import Mesh, StrategyCost, mesh_settings
from disttrain.strategies.tensor import check_tensor

if TYPE_CHECKING:
    from disttrain.strategies.runspec import RunSpec

__all__ = ["TensorCost"]


def _planned(model: nn.Module, assigned: dict[str, plan.Style], size: int) -> float:
    """The share of ``model``'s parameters (each counted once: a tied weight is one) a rank
    holds when ``assigned`` cuts them over ``size`` ranks (tp_modules.slices_of)."""
    cut: set[int] = set()
    for path, style in assigned.items():
        module = model.get_submodule(path)
        for name in tp_modules.slices_of(style.name, style.blocks, module):
            param = module._parameters.get(name)  # an ``attention`` entry cuts none itself
            if param is not None:
                cut.add(id(param))
    params = list(model.parameters())  # unique
    held = sum(p.numel() / size if id(p) in cut else p.numel() for p in params)
    return held / max(sum(p.numel() for p in params), 1)


class TensorCost(StrategyCost):
    """The memory of one slice (``advise``)."""

    not_modelled: ClassVar[str] = (
        "its step depends on the activations exchanged inside every layer, which a "
        "parameter count does not give"
    )
    cost_settings: ClassVar[tuple[str, ...]] = ("tensor_mode", "tp_plan")

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
        gradients and optimizer state; a model with a plan (``tp_plan``, a transformers
        model's own): 1/T of each parameter the plan cuts (:func:`_planned`). Activations
        are not counted."""
        pc: ParallelConfig = spec.config().section(ParallelConfig)
        # training's refusals, in its words (a Linear that splits: checked there too)
        assigned = check_tensor(model, nodes, pc, "--nodes")
        if assigned is not None:
            return costing.worker_memory(work, work.params * _planned(model, assigned, nodes))
        layers = placement.check_sequential(model, "tensor")
        kinds = tensor.plan(layers, nodes, pc.tensor_mode)
        held = 0.0
        for layer, kind in zip(layers, kinds, strict=True):
            for name, p in layer.named_parameters():
                whole = kind == "rep" or (kind == "row" and name == "bias")
                held += p.numel() if whole else p.numel() / nodes
        total = sum(p.numel() for layer in layers for p in layer.parameters())
        return costing.worker_memory(work, work.params * held / max(total, 1))
