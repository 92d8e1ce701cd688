"""Balanced split of a flat tensor into chunks, one per rank, and of chunks into segments.

``numel`` elements into ``parts`` chunks: the first ``numel % parts`` chunks get
one element more, so sizes differ by at most one and lengths that are not
multiples of ``parts`` (or smaller than it: empty chunks) need no padding.
Both ends of every message compute the same bounds, so nothing about sizes is
ever sent.

Pipelined algorithms cut each chunk again into segments of about
:func:`segment_bytes` bytes (same balanced split), so that one segment can be
summed while the next is on the wire. Sender and receiver segment the same
chunk, so they agree on the segments without a header.
"""

from __future__ import annotations

__all__ = [
    "chunk_bounds",
    "chunk_sizes",
    "segment_bounds",
    "segment_bytes",
    "segment_count",
    "set_segment_bytes",
]

# 16 MiB. A chunk (1/n of a tensor) is cut only when larger than this, so a bucket
# of up to 16 MiB is never segmented: at the default --fusion-mb 4 training sends
# one message per chunk and segment pipelining is off (pinned by
# tests/collectives/test_chunks.py). Smaller segments overlap the sum with the
# transfer, but every segment is one more blocking wait, and on the loaded 2-core
# box a wake-up waits for the scheduler: measured there (a throw-away script),
# 1 and 4 MiB segments were 20-25 % slower than one message per chunk. Re-run with
# `disttrain bench ring-segments` (docs/collectives.md). With free cores, smaller may win.
_segment = 16 << 20


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


def segment_bytes() -> int:
    return _segment


def set_segment_bytes(nbytes: int) -> int:
    """Set the target segment size for every pipelined algorithm; return the old one.

    All ranks must use the same value (it decides the message boundaries).
    """
    if nbytes < 1:
        raise ValueError(f"segment size must be at least 1 byte, got {nbytes}")
    global _segment
    old, _segment = _segment, nbytes
    return old


def segment_count(numel: int, itemsize: int) -> int:
    """Segments of a chunk of ``numel`` elements: ceil(bytes / segment size), 0 if empty."""
    if numel == 0:
        return 0
    return min(numel, -(-numel * itemsize // _segment))


def segment_bounds(numel: int, itemsize: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of each segment of a chunk, relative to the chunk's start."""
    count = segment_count(numel, itemsize)
    return chunk_bounds(numel, count) if count else []
