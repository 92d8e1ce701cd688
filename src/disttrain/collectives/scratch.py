"""Receive buffers kept between calls, so that transfers do not pay for fresh pages.

A freshly allocated large tensor is fresh pages from the kernel, and the page
faults are taken by gloo's receiving thread during the transfer. Each
algorithm therefore asks for its scratch space here by slot; a slot grows
when needed and is never shrunk until :func:`release` is called.

Slots are per thread. An algorithm is synchronous, so one thread never runs
two calls at once, but two threads can: the reducer and the DDP hooks run
algorithms on a communication thread (``comm/commthread.py``) while
the main thread may call ``all_reduce(x, "ring")`` itself. With one shared
slot both calls would receive into the same buffer. Each thread therefore
keeps its own slots (``threading.local``), reused across that thread's calls;
they are freed when the thread ends or on :func:`release`.
"""

from __future__ import annotations

import threading
import weakref

import torch

__all__ = ["buffer", "release"]

_Key = tuple[str, int, torch.dtype, torch.device]


class _Slots:
    """One thread's buffers (a class, not a bare dict, so that a WeakSet can hold it)."""

    def __init__(self) -> None:
        self.held: dict[_Key, torch.Tensor] = {}


_local = threading.local()
# Every live thread's slots, so that release() can free them all; an entry goes
# away by itself when its thread ends and drops its thread-local data.
_all: weakref.WeakSet[_Slots] = weakref.WeakSet()
_lock = threading.Lock()


def _mine() -> dict[_Key, torch.Tensor]:
    slots: _Slots | None = getattr(_local, "slots", None)
    if slots is None:
        slots = _Slots()
        _local.slots = slots
        with _lock:
            _all.add(slots)
    return slots.held


def buffer(
    owner: str, slot: int, numel: int, dtype: torch.dtype, device: torch.device | None = None
) -> torch.Tensor:
    """A 1-D tensor of ``numel`` elements, reused by this thread for (owner, slot, dtype, device).

    ``device``: the tensor being reduced's (a GPU's gradients are summed on the GPU)."""
    held = _mine()
    where = torch.device("cpu") if device is None else device
    key = (owner, slot, dtype, where)
    kept = held.get(key)
    if kept is None or kept.numel() < numel:
        kept = torch.empty(numel, dtype=dtype, device=where)
        held[key] = kept
    return kept[:numel]


def release() -> None:
    """Free every kept buffer of every thread (memory returns to the allocator).

    A buffer handed out to a call still running stays alive until that call returns.
    """
    with _lock:
        for slots in list(_all):
            slots.held.clear()
