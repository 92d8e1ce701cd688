"""Tensor fusion: gradients packed into flat buckets by size, in the order backward produces them.

One allreduce of S bytes costs about ``a + S/b`` (latency a, bandwidth b);
k separate allreduces cost ``k*a + S/b``. Fusing small gradients into one
buffer (Horovod's tensor fusion, DDP's buckets) pays the latency once per
bucket, while keeping buckets small enough that the first ones can be sent
while backward is still computing the rest. Backward produces gradients
roughly in *reverse* registration order (the last layer first), so buckets are
filled in that order: bucket 0 holds the last layers and is ready first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

__all__ = ["MB", "FlatBucket", "assign_by_size", "flatten", "make_buckets", "unflatten"]

#: Bytes in one "MB" of ``--fusion-mb`` (binary, as DDP's ``bucket_cap_mb``).
MB = 1024 * 1024


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One contiguous 1-D tensor holding ``tensors`` one after the other (same dtype)."""
    return _flatten_dense_tensors(list(tensors))


def unflatten(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Views of ``flat`` shaped as ``like`` (the inverse of :func:`flatten`)."""
    return list(_unflatten_dense_tensors(flat, list(like)))


def assign_by_size(tensors: Sequence[torch.Tensor], cap_bytes: int) -> list[list[int]]:
    """Split the indices of ``tensors`` into buckets of at most ``cap_bytes``, keeping their order.

    A bucket takes tensors while the total stays within ``cap_bytes``; a tensor
    larger than the cap gets a bucket of its own (Horovod's fusion buffer rule).
    Tensors of different dtype or device never share a bucket: a bucket is one
    flat buffer. ``cap_bytes <= 0`` turns fusion off: one tensor per bucket.
    """
    buckets: list[list[int]] = []
    open_: dict[tuple[torch.dtype, torch.device], tuple[list[int], int]] = {}
    for i, t in enumerate(tensors):
        key = (t.dtype, t.device)
        nbytes = t.numel() * t.element_size()
        current = open_.get(key)
        if current is not None and current[1] + nbytes <= cap_bytes:
            current[0].append(i)
            open_[key] = (current[0], current[1] + nbytes)
            continue
        bucket = [i]
        buckets.append(bucket)
        open_[key] = (bucket, nbytes)
    return buckets


@dataclass
class FlatBucket:
    """One fusion buffer: ``tensors`` laid out back to back in ``buffer``, with a view of each."""

    index: int
    tensors: list[torch.Tensor]
    buffer: torch.Tensor
    views: list[torch.Tensor] = field(default_factory=list)

    @classmethod
    def of(cls, index: int, tensors: list[torch.Tensor]) -> FlatBucket:
        numel = sum(t.numel() for t in tensors)
        buffer = torch.zeros(numel, dtype=tensors[0].dtype, device=tensors[0].device)
        views, offset = [], 0
        for t in tensors:
            views.append(buffer[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
        return cls(index, tensors, buffer, views)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


def make_buckets(tensors: Sequence[torch.Tensor], cap_bytes: int) -> list[FlatBucket]:
    """Buckets for ``tensors`` (give them in the order their gradients become ready)."""
    return [
        FlatBucket.of(b, [tensors[i] for i in idx])
        for b, idx in enumerate(assign_by_size(tensors, cap_bytes))
    ]
