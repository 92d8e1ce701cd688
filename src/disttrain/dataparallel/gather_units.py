"""What ZeRO stage 3 gathers together (its units), the model checks, and a unit's outputs.

A unit is one flat group of the shard layout and the modules whose forward reads it:

- each top-level child's own trainable parameters: a *layer*, gathered for the child's
  forward and again for its backward, freed after each;
- the root's own parameters (read anywhere in the root's forward) and the *shared*
  parameters, those two or more top-level children hold (a language model's tied
  embedding: ``lm_head.weight is transformer.wte.weight``): *kept* units, gathered at
  the forward of the first module that uses them and kept until the step ends.

Why shared parameters are a kept unit of their own. Each use saves views of the weight
for its backward, and the uses' backward passes interleave with other layers' (GPT-2:
lm_head's runs first, the embedding's last), so freeing it between uses would need a
count of uses made at run time, per forward. Kept for the step, it is gathered exactly
when any user computes, in forward and in backward, with no bookkeeping; what it costs
is its bytes for the step, which a tied embedding costs anyway (the embedding is the
first op of the forward and its gradient the last of the backward). The other simple
design, the shared weight staying in the first holder's group with that group kept,
would keep the whole first layer (GPT-2: the whole transformer) gathered instead. Its
gradient needs nothing of ours: autograd sums every use into the parameter's one
AccumulateGrad, whose post-accumulate hook (the reducer's) then runs once per backward
with the whole gradient; the reducer refuses a second one before the step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from disttrain.comm.errors import UsageError

__all__ = ["Unit", "check_units", "gather_units", "layer_groups", "layer_units", "output_tensors"]


@dataclass
class Unit:
    """One gathered unit: its parameters (one flat group) and the modules that read them."""

    name: str  # for messages: the child's name, "<root>" or "shared (a = b, ...)"
    params: list[nn.Parameter]
    users: list[nn.Module]  # each one's forward gathers it (a layer has one user)
    kept: bool  # gathered from its first use until the step ends (root's own, shared)


def _trainable(params: Iterable[nn.Parameter | None]) -> list[nn.Parameter]:
    return [p for p in params if p is not None and p.requires_grad]


def gather_units(model: nn.Module) -> list[Unit]:
    """``model``'s units in forward (registration) order: each top-level child's own
    parameters, the shared ones just before their first user, the root's own last."""
    holders = [(name, c, _trainable(c.parameters())) for name, c in model.named_children()]
    holders.append(("<root>", model, _trainable(model._parameters.values())))
    held_by: dict[int, int] = {}
    for _, _, params in holders:
        for p in params:
            held_by[id(p)] = held_by.get(id(p), 0) + 1
    shared = list({id(p): p for _, _, ps in holders for p in ps if held_by[id(p)] > 1}.values())
    shared_unit = Unit(_shared_name(model, shared), shared, [], kept=True)
    units: list[Unit] = []
    for name, module, params in holders:
        if any(held_by[id(p)] > 1 for p in params):
            if not shared_unit.users:  # placed before its first user, in forward order
                units.append(shared_unit)
            shared_unit.users.append(module)
        own = [p for p in params if held_by[id(p)] == 1]
        if own:
            units.append(Unit(name, own, [module], kept=module is model))
    return units


def _shared_name(model: nn.Module, shared: list[nn.Parameter]) -> str:
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return "shared (" + ", ".join(" = ".join(names[id(p)]) for p in shared) + ")"


def layer_units(model: nn.Module) -> list[tuple[nn.Module, list[nn.Parameter]]]:
    """The units as (first user, parameters) pairs, in forward order."""
    return [(unit.users[0], unit.params) for unit in gather_units(model)]


def layer_groups(model: nn.Module) -> list[list[nn.Parameter]]:
    """The layout's groups for stage 3: one per unit, last first (backward's order)."""
    return [unit.params for unit in reversed(gather_units(model))]


def check_units(model: nn.Module) -> list[Unit]:
    """``model``'s units, or a :class:`UsageError` (one line) if ZeRO stage 3 cannot run it:
    a unit's parameters are packed into one flat buffer, so they must share a dtype, a
    device and the strided layout (``torch.cat`` would silently cast mixed ones)."""
    units = gather_units(model)
    if not units:
        raise UsageError(
            f"ZeRO stage 3: {type(model).__name__} has no trainable parameters to shard"
        )
    for unit in units:
        kinds = sorted({f"{p.dtype} on {p.device}" for p in unit.params})
        if len(kinds) > 1:
            raise UsageError(
                f"ZeRO stage 3 packs each unit's parameters into one flat buffer, and unit "
                f"{unit.name!r} mixes {' and '.join(kinds)}: give them one dtype and device "
                "(e.g. model.float()) before sharding"
            )
        if any(p.layout != torch.strided for p in unit.params):
            raise UsageError(
                f"ZeRO stage 3 shards dense parameters only: unit {unit.name!r} has a sparse one"
            )
    return units


def output_tensors(output: Any) -> list[torch.Tensor]:
    """Every tensor in a unit's output, whatever holds it: tuples, lists, any Mapping (a
    dict, a Hugging Face ``ModelOutput``), dataclasses, and whatever else pytree flattens
    (named tuples and registered types). A tensor inside any other object is not found."""
    found: list[torch.Tensor] = []
    todo, seen = [output], set()
    while todo:
        obj = todo.pop()
        if isinstance(obj, torch.Tensor):
            found.append(obj)
            continue
        if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
            continue
        seen.add(id(obj))
        if isinstance(obj, Mapping):
            todo.extend(obj.values())
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            todo.extend(getattr(obj, f.name) for f in dataclasses.fields(obj))
        elif isinstance(obj, (list, tuple)):
            todo.extend(obj)
        else:
            leaves = pytree.tree_leaves(obj)
            if not (len(leaves) == 1 and leaves[0] is obj):  # a container pytree knows
                todo.extend(leaves)
    return found
