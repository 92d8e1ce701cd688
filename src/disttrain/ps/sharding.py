"""Contiguous shards of the flattened parameters: server k owns elements [lo_k, hi_k).

The parameters are flattened in ``model.parameters()`` order into one vector
of P elements and cut into K nearly equal ranges (the first P mod K shards get
one element more), so every server holds the same load whatever the layer
sizes; a shard may span several layers, or part of one.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["flatten", "shard_bounds", "unflatten_into"]


def shard_bounds(total: int, shards: int) -> list[tuple[int, int]]:
    """``shards`` contiguous ranges covering ``range(total)``, sizes differing by at most one."""
    if shards <= 0:
        raise ValueError(f"shards must be positive, got {shards}")
    if total < shards:
        raise ValueError(f"{total} elements cannot be cut into {shards} non-empty shards")
    base, extra = divmod(total, shards)
    out, lo = [], 0
    for k in range(shards):
        hi = lo + base + (1 if k < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def flatten(tensors: Iterable[torch.Tensor | None], like: Iterable[torch.Tensor]) -> torch.Tensor:
    """One flat fp32/fp64 vector of ``tensors`` (a missing gradient counts as zeros)."""
    parts = [
        (t if t is not None else torch.zeros_like(ref)).detach().reshape(-1)
        for t, ref in zip(tensors, like, strict=True)
    ]
    return torch.cat(parts) if parts else torch.empty(0)


@torch.no_grad()
def unflatten_into(flat: torch.Tensor, tensors: Iterable[torch.Tensor]) -> None:
    """Copy consecutive slices of ``flat`` into ``tensors`` (in place)."""
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n
    if offset != flat.numel():
        raise ValueError(f"flat vector has {flat.numel()} elements, the tensors {offset}")
