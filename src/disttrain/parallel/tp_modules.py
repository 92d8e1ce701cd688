"""The modules a tensor-parallel plan puts in place: one rank's slice of a layer.

``colwise``: a ``nn.Linear`` (or transformers' ``Conv1D``, whose weight is stored
transposed, (in, out)) keeps a slice of its output features; its input must be the
whole activation, so it enters through Megatron's ``f`` (identity forward, the input
gradient summed over the group in backward). ``packed_colwise:N``: the output is N
equal blocks side by side (GPT-2's ``c_attn`` holds q, k and v), each sliced alike, so
that a rank holds the same heads of each. ``colwise_gather_output``: colwise, then the
slices all-gathered. ``rowwise``: a slice of the input features; its output is a
partial sum, summed over the group by ``g`` (allreduce forward, identity backward),
the bias (replicated) added once after. ``embedding_rowwise``: an ``nn.Embedding``'s
rows split by vocabulary range: each rank looks up the ids it holds, zeros elsewhere,
and ``g`` sums the ranks' parts (Megatron's vocabulary-parallel embedding).

Siblings fed the same tensor (Llama's q, k and v projections; gate and up) share one
``f`` (:class:`TensorGroup`), so that backward sums their input gradients first and
allreduces once: one allreduce per attention or MLP block each way, as Megatron.
Every sliced parameter records how it was cut (:data:`Slice`), so that the whole
tensor can be put back together (:func:`join`).
"""

from __future__ import annotations

import weakref
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F

from disttrain import collectives
from disttrain.parallel.tensor import copy_in, gather_out, reduce_out

__all__ = [
    "ParallelLinear",
    "Slice",
    "TensorGroup",
    "VocabParallelEmbedding",
    "is_conv1d",
    "join",
    "slices_of",
    "take",
    "widths",
]

#: how a parameter is cut: (dimension, blocks): the dimension holds ``blocks`` equal
#: blocks side by side, and each block is cut into equal consecutive slices, one a rank
Slice = tuple[int, int]


def is_conv1d(module: nn.Module) -> bool:
    """transformers' ``Conv1D`` (GPT-2's projections): a Linear whose weight is (in, out)."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and hasattr(module, "nx")


def widths(module: nn.Module) -> tuple[int, int]:
    """(input features, output features) of a Linear or a Conv1D."""
    if is_conv1d(module):
        return int(module.nx), int(module.nf)  # type: ignore[arg-type]
    assert isinstance(module, nn.Linear)
    return module.in_features, module.out_features


def slices_of(style: str, blocks: int, module: nn.Module) -> dict[str, Slice]:
    """How ``style`` cuts each of ``module``'s parameters (those not named: replicated)."""
    if style == "embedding_rowwise":
        return {"weight": (0, 1)}
    conv = is_conv1d(module)
    if style == "rowwise":  # the input features: a Linear's columns, a Conv1D's rows
        return {"weight": (0 if conv else 1, 1)}
    cut = {"weight": (1 if conv else 0, blocks)}  # the output features
    if getattr(module, "bias", None) is not None:
        cut["bias"] = (0, blocks)
    return cut


def take(t: torch.Tensor, cut: Slice, rank: int, size: int) -> torch.Tensor:
    """Rank ``rank``'s slice of ``t`` (a copy)."""
    dim, blocks = cut
    parts = t.chunk(blocks, dim)
    n = parts[0].shape[dim] // size
    return torch.cat([p.narrow(dim, rank * n, n) for p in parts], dim).clone()


def join(parts: list[torch.Tensor], cut: Slice) -> torch.Tensor:
    """The whole tensor from every rank's slice (in rank order): :func:`take` undone."""
    dim, blocks = cut
    per_rank = [p.chunk(blocks, dim) for p in parts]
    return torch.cat([r[b] for b in range(blocks) for r in per_rank], dim)


class TensorGroup:
    """The group a model's slices communicate in, and the ``f`` its siblings share.

    A column layer's input passes ``f`` once per tensor: a second sibling fed the same
    tensor (same object, same version, in the same forward) gets the first one's
    output, so autograd adds the siblings' gradients before the one allreduce. That
    output is held until :meth:`clear` (the model's forward pre- and post-hook): a weak
    reference would die with its Python object while autograd still holds the tensor."""

    def __init__(self, group: Any, algorithm: collectives.Algorithm, rank: int, size: int):
        self.group, self.algorithm, self.rank, self.size = group, algorithm, rank, size
        self._last: tuple[Any, int, Any] | None = None

    def clear(self, *_: Any) -> None:
        self._last = None

    def copy_in(self, x: torch.Tensor) -> torch.Tensor:
        last = self._last
        if last is not None and last[0]() is x and last[1] == x._version:
            return last[2]
        out = copy_in(x, self.group, self.algorithm)
        self._last = (weakref.ref(x), x._version, out)
        return out


def _sliced(
    full: nn.Module, cuts: dict[str, Slice], group: TensorGroup, made: dict[int, nn.Parameter]
) -> dict[str, nn.Parameter | None]:
    """``full``'s parameters for this rank: its slice of each cut one (a parameter two
    modules share, a tied weight, is cut once: ``made``), the rest the same objects."""
    out: dict[str, nn.Parameter | None] = {}
    for name, p in full.named_parameters(recurse=False):
        if name not in cuts:
            out[name] = p  # replicated: trained in place, the same on every rank
            continue
        if id(p) not in made:
            piece = take(p.detach(), cuts[name], group.rank, group.size)
            made[id(p)] = nn.Parameter(piece, requires_grad=p.requires_grad)
        out[name] = made[id(p)]
    if "bias" not in out:
        out["bias"] = None
    return out


class ParallelLinear(nn.Module):
    """This rank's slice of a Linear or Conv1D, cut ``colwise``, ``packed_colwise:N``,
    ``colwise_gather_output`` or ``rowwise`` (the module text)."""

    def __init__(
        self,
        full: nn.Module,
        style: str,
        blocks: int,
        group: TensorGroup,
        made: dict[int, nn.Parameter],
    ) -> None:
        super().__init__()
        self.style, self.group = style, group
        self.rowwise = style == "rowwise"
        self.transposed = is_conv1d(full)  # Conv1D: y = x @ W + b, W (in, out)
        self.slices = slices_of(style, blocks, full)
        for name, p in _sliced(full, self.slices, group, made).items():
            self.register_parameter(name, p)

    def _apply_weight(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        w = cast(torch.Tensor, self.weight)
        if not self.transposed:
            return F.linear(x, w, bias)
        flat = x.reshape(-1, x.shape[-1])
        y = torch.mm(flat, w) if bias is None else torch.addmm(bias, flat, w)
        return y.view(*x.shape[:-1], w.shape[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.group
        bias = cast("torch.Tensor | None", self.bias)
        if self.rowwise:  # partial sums of the whole output; the bias once, after the sum
            y = reduce_out(self._apply_weight(x, None), g.group, g.algorithm)
            return y if bias is None else y + bias
        y = self._apply_weight(g.copy_in(x), bias)
        return gather_out(y, g.group) if self.style == "colwise_gather_output" else y

    def extra_repr(self) -> str:
        return f"{self.style}, rank {self.group.rank} of {self.group.size}"


class VocabParallelEmbedding(nn.Module):
    """This rank's range of an ``nn.Embedding``'s rows (``embedding_rowwise``)."""

    def __init__(
        self, full: nn.Embedding, group: TensorGroup, made: dict[int, nn.Parameter]
    ) -> None:
        super().__init__()
        self.group = group
        self.slices = slices_of("embedding_rowwise", 1, full)
        self.register_parameter("weight", _sliced(full, self.slices, group, made)["weight"])
        n = full.num_embeddings // group.size
        self.lo, self.hi = group.rank * n, (group.rank + 1) * n
        pad = full.padding_idx  # its row gets no gradient, on the rank that holds it
        self.padding_idx = pad - self.lo if pad is not None and self.lo <= pad < self.hi else None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mine = (ids >= self.lo) & (ids < self.hi)
        local = torch.where(mine, ids - self.lo, torch.zeros_like(ids))
        rows = F.embedding(local, cast(torch.Tensor, self.weight), self.padding_idx)
        # another rank's ids: zero here (and no gradient to the row 0 they were read from)
        rows = rows.masked_fill(~mine.unsqueeze(-1), 0.0)
        return reduce_out(rows, self.group.group, self.group.algorithm)

    def extra_repr(self) -> str:
        return f"rows {self.lo}..{self.hi - 1}, rank {self.group.rank} of {self.group.size}"
