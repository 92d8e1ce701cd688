"""Helpers over a worker's tensors and state trees: bytes held, peak memory, averages."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["average_states", "peak_rss_bytes", "storage_bytes"]


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views of one buffer count it once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        if storage.nbytes():
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def peak_rss_bytes() -> int:
    """This process's peak resident set size (``getrusage``: KiB on Linux, bytes on macOS)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def average_states(states: list[Any]) -> Any:
    """The element-wise mean of equally shaped state trees: floating-point tensors and
    floats are averaged; every other value (integer tensors such as an RNG state,
    step counters, strings) is the first tree's. Equal values (replicas of synchronous
    data parallelism) are kept as they are, without rounding."""
    first = states[0]
    if isinstance(first, torch.Tensor):
        if first.is_floating_point() and not all(torch.equal(first, s) for s in states[1:]):
            return torch.stack([s.to(first.dtype) for s in states]).mean(dim=0)
        return first.clone()
    if isinstance(first, dict):
        return {k: average_states([s[k] for s in states]) for k in first}
    if isinstance(first, (list, tuple)):
        items = [average_states([s[i] for s in states]) for i in range(len(first))]
        return type(first)(items)
    if isinstance(first, float) and any(s != first for s in states[1:]):
        return sum(states) / len(states)
    return first
