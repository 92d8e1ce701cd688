"""Balanced split of a flat tensor into contiguous chunks, one per rank (or per step).

``numel`` elements into ``parts`` chunks: the first ``numel % parts`` chunks get
one element more, so sizes differ by at most one and lengths that are not
multiples of ``parts`` (or smaller than it: empty chunks) need no padding.
Both ends of every message compute the same bounds, so nothing about sizes is
ever sent.
"""

from __future__ import annotations

__all__ = ["chunk_bounds", "chunk_sizes"]


def chunk_sizes(numel: int, parts: int) -> list[int]:
    """Element counts of the ``parts`` chunks of ``numel`` elements."""
    base, extra = divmod(numel, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def chunk_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of each chunk, in order."""
    bounds = []
    start = 0
    for size in chunk_sizes(numel, parts):
        bounds.append((start, start + size))
        start += size
    return bounds
