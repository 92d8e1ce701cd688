"""Tensor slicing: each Linear layer's neurons split across the ranks of a group.

Two ways, selectable with ``--tensor-mode``:

``megatron`` (Shoeybi et al., 2019): a Linear split by output columns, then
the next Linear (after elementwise layers such as ReLU) split by input rows.
The first needs the whole input and yields a slice of its output; the
elementwise layer works on the slice; the second turns slices into partial
sums of its whole output. One allreduce per pair in forward (``g``), one in
backward (``f``: the input gradient of the column layer is a partial sum).

``naive`` (the seed's vertical slicing: "the left half of each layer on one
device, the right half on another"): every Linear split by output columns,
and since "each half of the next layer requires the output of both halves",
its output is all-gathered after every layer (backward: an allreduce of the
input gradient). Twice as many messages as Megatron per pair of layers.

Layers that cannot be split (a width not divisible by the group size, or not a
Linear at all) are replicated: every rank computes them on the same input.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup
from torch.nn import functional as F

from disttrain import collectives
from disttrain.comm import p2p, phases

__all__ = [
    "ELEMENTWISE",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "all_gather_last",
    "copy_in",
    "gather_into",
    "gather_out",
    "plan",
    "reduce_out",
    "shard_model",
]

#: Layers that act on each neuron alone, so they run unchanged on a column slice.
ELEMENTWISE = (nn.ReLU, nn.GELU, nn.Tanh, nn.Sigmoid, nn.SiLU, nn.LeakyReLU, nn.Identity)


def all_gather_last(x: torch.Tensor, group: ProcessGroup | None) -> torch.Tensor:
    """Concatenate every rank's ``x`` along the last dimension: a ring of metered p2p steps,
    each rank sending (n-1) chunks of |x| bytes to its right neighbour."""
    n, rank = p2p.group_size(group), p2p.group_rank(group)
    chunks = [torch.empty_like(x) for _ in range(n)]
    chunks[rank] = x.contiguous()
    for step in range(n - 1):
        out_i, in_i = (rank - step) % n, (rank - step - 1) % n
        p2p.exchange(chunks[out_i], (rank + 1) % n, chunks[in_i], (rank - 1) % n, group)
    return torch.cat(chunks, dim=-1)


class _Copy(torch.autograd.Function):
    """Megatron's ``f``: identity forward; the input gradient is summed over the group."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, group: Any, algorithm: collectives.Algorithm
    ) -> torch.Tensor:
        ctx.group, ctx.algorithm = group, algorithm
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        grad = grad.contiguous().clone()
        with phases.book(phases.COMMUNICATION):  # inside the trainer's backward (compute)
            return collectives.all_reduce(grad, ctx.algorithm, ctx.group), None, None


class _Reduce(torch.autograd.Function):
    """Megatron's ``g``: partial sums summed over the group forward; identity backward."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, group: Any, algorithm: collectives.Algorithm
    ) -> torch.Tensor:
        with phases.book(phases.COMMUNICATION):  # inside the trainer's forward (compute)
            return collectives.all_reduce(x.contiguous().clone(), algorithm, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad, None, None


class _Gather(torch.autograd.Function):
    """All-gather column slices forward; backward keeps this rank's slice of the gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group, ctx.width = group, x.shape[-1]
        with phases.book(phases.COMMUNICATION):  # inside the trainer's forward (compute)
            return all_gather_last(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        lo = p2p.group_rank(ctx.group) * ctx.width
        return grad[..., lo : lo + ctx.width].contiguous(), None


def copy_in(x: torch.Tensor, group: Any, algorithm: collectives.Algorithm) -> torch.Tensor:
    """``f``: ``x`` unchanged; its gradient summed over the group in backward."""
    out: torch.Tensor = _Copy.apply(x, group, algorithm)
    return out


def reduce_out(x: torch.Tensor, group: Any, algorithm: collectives.Algorithm) -> torch.Tensor:
    """``g``: the partial sums ``x`` summed over the group; the gradient passes unchanged."""
    out: torch.Tensor = _Reduce.apply(x, group, algorithm)
    return out


def gather_out(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Column slices concatenated along the last dimension; backward keeps this rank's."""
    out: torch.Tensor = _Gather.apply(x, group)
    return out


class ColumnParallelLinear(nn.Module):
    """This rank's slice of a Linear's output neurons (rows of its weight)."""

    def __init__(
        self,
        full: nn.Linear,
        rank: int,
        size: int,
        group: Any,
        algorithm: collectives.Algorithm,
        gather: bool,
    ) -> None:
        super().__init__()
        n = full.out_features // size
        self.weight = nn.Parameter(full.weight.detach()[rank * n : (rank + 1) * n].clone())
        b = full.bias
        self.bias = (
            None if b is None else nn.Parameter(b.detach()[rank * n : (rank + 1) * n].clone())
        )
        self.group, self.algorithm, self.gather = group, algorithm, gather

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(_Copy.apply(x, self.group, self.algorithm), self.weight, self.bias)
        return _Gather.apply(out, self.group) if self.gather else out


class RowParallelLinear(nn.Module):
    """This rank's slice of a Linear's input neurons (columns of its weight); bias added once."""

    def __init__(
        self, full: nn.Linear, rank: int, size: int, group: Any, algorithm: collectives.Algorithm
    ) -> None:
        super().__init__()
        n = full.in_features // size
        self.weight = nn.Parameter(full.weight.detach()[:, rank * n : (rank + 1) * n].clone())
        b = full.bias
        self.bias = nn.Parameter(b.detach().clone()) if b is not None else None
        self.group, self.algorithm = group, algorithm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _Reduce.apply(F.linear(x, self.weight), self.group, self.algorithm)
        return out + self.bias if self.bias is not None else out


def plan(layers: list[nn.Module], size: int, mode: str) -> list[str]:
    """Per layer: ``col`` / ``row`` (a Megatron pair), ``colgather`` (naive) or ``rep``."""
    kinds = ["rep"] * len(layers)
    i = 0
    while i < len(layers):
        layer = layers[i]
        if isinstance(layer, nn.Linear) and layer.out_features % size == 0:
            if mode == "naive":
                kinds[i] = "colgather"
            else:
                j = i + 1
                while j < len(layers) and isinstance(layers[j], ELEMENTWISE):
                    j += 1
                nxt = layers[j] if j < len(layers) else None
                if isinstance(nxt, nn.Linear) and nxt.in_features == layer.out_features:
                    kinds[i], kinds[j] = "col", "row"
                    i = j
        i += 1
    return kinds


def shard_model(
    model: nn.Sequential,
    rank: int,
    size: int,
    group: Any,
    mode: str,
    algorithm: collectives.Algorithm = "native",
) -> tuple[nn.Sequential, list[str]]:
    """This rank's tensor-parallel model (same layer names) and the plan it follows."""
    if mode not in ("megatron", "naive"):
        raise ValueError(f"unknown tensor mode {mode!r}: use megatron or naive")
    layers = list(model)
    kinds = plan(layers, size, mode)
    out: OrderedDict[str, nn.Module] = OrderedDict()
    for (name, layer), kind in zip(model.named_children(), kinds, strict=True):
        if kind in ("col", "colgather"):
            gather = kind == "colgather"
            out[name] = ColumnParallelLinear(layer, rank, size, group, algorithm, gather)  # type: ignore[arg-type]
        elif kind == "row":
            out[name] = RowParallelLinear(layer, rank, size, group, algorithm)  # type: ignore[arg-type]
        else:
            out[name] = layer
    return nn.Sequential(out), kinds


@torch.no_grad()
def gather_into(
    full: nn.Sequential | None, sharded: nn.Sequential, kinds: list[str], group: Any
) -> None:
    """Collect every rank's slices into ``full`` on group rank 0 (called on every rank)."""
    n = p2p.group_size(group)
    for (name, layer), kind in zip(sharded.named_children(), kinds, strict=True):
        if kind == "rep":
            if full is not None and full._modules[name] is not layer:
                full._modules[name].load_state_dict(layer.state_dict())
            continue
        for pname, t in layer.named_parameters():
            whole_dim = 1 if (kind == "row" and pname == "weight") else 0
            parts: list[torch.Tensor]
            if kind == "row" and pname == "bias":
                parts = [t.detach()]  # replicated: the same on every rank
            else:
                mine = t.detach().contiguous()
                if p2p.staged(mine, group):  # --backend gloo: through the host, as proven
                    mine = mine.cpu()
                parts = [torch.empty_like(mine) for _ in range(n)]
                dist.all_gather(parts, mine, group=group)
            if full is not None:
                getattr(full._modules[name], pname).copy_(torch.cat(parts, dim=whole_dim))
