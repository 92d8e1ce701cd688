"""glibc's malloc in a job's processes: buffers the size of the model stay mapped once freed.

A step allocates and frees buffers as large as the model: a flat gradient, a message to
a parameter server and the one received (26 MB each for the default mlp). glibc serves a
buffer above its mmap threshold (dynamic, 128 KB to 32 MB) as a mapping of its own and
unmaps it on free, and trims the heap's top once twice the threshold is free there;
either way the next step touches fresh pages, each a page fault. A 3-epoch ``--strategy
ps`` run of the default workload took 4.0 million faults and spent 10 of its 21
CPU-seconds in the kernel; with both limits raised, 0.31 million and 12 CPU-seconds in
all, at the same peak RSS (decentralized: 0.93 M -> 0.25 M faults; pipeline 0.65 M ->
0.21 M; allreduce, which reuses its buckets, unchanged). PyTorch's CUDA allocator caches
freed blocks for the same reason.

A process keeps up to ``TRIM`` bytes of freed heap for reuse. A buffer over ``MMAP`` is
still a mapping of its own, returned at once. A user who set glibc's own knobs (its
``MALLOC_*_`` variables or ``GLIBC_TUNABLES``; docs/zero.md's limited run does) keeps them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["MMAP", "TRIM", "keep_freed_buffers"]

MMAP = 256 * 2**20  # M_MMAP_THRESHOLD: buffers up to this size come from the heap
TRIM = 512 * 2**20  # M_TRIM_THRESHOLD: free bytes at the heap's top kept before trimming
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
_USERS_OWN = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "GLIBC_TUNABLES",
)


def keep_freed_buffers() -> bool:
    """Raise both thresholds in this process; False where glibc is absent or the user set
    their own (then nothing changes)."""
    if any(name in os.environ for name in _USERS_OWN):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS): its own rules
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM))
