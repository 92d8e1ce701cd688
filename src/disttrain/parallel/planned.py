"""A model cut by a plan (:mod:`disttrain.parallel.plan`): this rank's model, the whole one back.

The user's model is not changed. This rank's model is a copy of only the modules on the
way to those the plan names (each a shallow copy: its own child table, the same
parameters and buffers), with the cut modules swapped for their slices
(:mod:`disttrain.parallel.tp_modules`) and each ``attention`` module's head counts made
per-rank. Everything else is the user's own module objects, so a replicated layer is
trained in place, a tied weight stays one Parameter, and on rank 0 the user's model
comes back whole once the slices are gathered into its cut modules (:func:`gather`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from disttrain import collectives
from disttrain.comm import p2p
from disttrain.parallel.plan import HEAD_ATTRIBUTES, Style
from disttrain.parallel.tp_modules import (
    ParallelLinear,
    TensorGroup,
    VocabParallelEmbedding,
    join,
)

__all__ = ["gather", "shard"]


def _shallow(module: nn.Module) -> nn.Module:
    """A copy of ``module`` with its own tables (children, parameters, buffers, hooks:
    a hook put on the copy is not the user's module's)."""
    out = copy.copy(module)
    for key, value in vars(module).items():
        if key.startswith("_") and isinstance(value, dict):
            setattr(out, key, copy.copy(value))
    return out


def _copied(root: nn.Module, path: str, copies: dict[str, nn.Module]) -> nn.Module:
    """The copy at ``path`` in ``root``, copying the modules on the way that are not yet."""
    node, here = root, ""
    for name in path.split(".") if path else []:
        here = f"{here}.{name}" if here else name
        if here not in copies:
            child = node._modules[name]
            assert child is not None
            copies[here] = node._modules[name] = _shallow(child)
        node = copies[here]
    return node


def shard(
    model: nn.Module,
    plan: dict[str, Style],
    rank: int,
    size: int,
    group: Any,
    algorithm: collectives.Algorithm,
) -> nn.Module:
    """This rank's model: ``model`` with the modules ``plan`` names cut into slice ``rank``
    of ``size`` (checked by :func:`~disttrain.parallel.plan.resolve` before)."""
    tg = TensorGroup(group, algorithm, rank, size)
    made: dict[int, nn.Parameter] = {}  # a tied weight is cut once
    root = _shallow(model)
    copies: dict[str, nn.Module] = {"": root}
    for path in sorted(plan, key=lambda p: p.count(".")):
        style = plan[path]
        if style.name == "attention":
            node = _copied(root, path, copies)
            for a in HEAD_ATTRIBUTES:  # its forward's per-rank shapes (heads / T)
                if isinstance(getattr(node, a, None), int):
                    setattr(node, a, getattr(node, a) // size)
            continue
        parent_path, _, name = path.rpartition(".")
        full = model.get_submodule(path)
        part: nn.Module
        if style.name == "embedding_rowwise":
            assert isinstance(full, nn.Embedding)
            part = VocabParallelEmbedding(full, tg, made)
        else:
            part = ParallelLinear(full, style.name, style.blocks, tg, made)
        _copied(root, parent_path, copies)._modules[name] = part
    root.register_forward_pre_hook(tg.clear)  # siblings share f within one forward only
    root.register_forward_hook(tg.clear)
    return root


@torch.no_grad()
def gather(full: nn.Module | None, sharded: nn.Module, group: Any) -> None:
    """Every rank's slices put together into ``full``'s cut modules (``full``: the user's
    model on the group's rank 0, None elsewhere; every rank of the group calls this)."""
    n = p2p.group_size(group)
    for path, module in sharded.named_modules():
        if not isinstance(module, (ParallelLinear, VocabParallelEmbedding)):
            continue
        for name, cut in module.slices.items():
            mine = getattr(module, name).detach().contiguous()
            if p2p.staged(mine, group):  # --backend gloo: through the host, as proven
                mine = mine.cpu()
            parts = [torch.empty_like(mine) for _ in range(n)]
            dist.all_gather(parts, mine, group=group)
            if full is not None:
                target = full.get_submodule(path).get_parameter(name)
                target.copy_(join(parts, cut).to(target.device))
