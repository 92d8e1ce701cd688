"""Receive buffers kept between calls, so that transfers do not pay for fresh pages.

A freshly allocated large tensor is fresh pages from the kernel, and the page
faults are taken by gloo's receiving thread during the transfer. Each
algorithm therefore asks for its scratch space here by slot; a slot grows
when needed and is never shrunk until :func:`release` is called. Algorithms
are synchronous, so a slot is never used by two calls at once.
"""

from __future__ import annotations

import torch

__all__ = ["buffer", "release"]

_SLOTS: dict[tuple[str, int, torch.dtype], torch.Tensor] = {}


def buffer(owner: str, slot: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A 1-D tensor of ``numel`` elements, reused across calls for (owner, slot, dtype)."""
    key = (owner, slot, dtype)
    held = _SLOTS.get(key)
    if held is None or held.numel() < numel:
        held = torch.empty(numel, dtype=dtype)
        _SLOTS[key] = held
    return held[:numel]


def release() -> None:
    """Free every kept buffer (memory returns to the allocator)."""
    _SLOTS.clear()
