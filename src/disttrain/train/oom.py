"""An allocation that fails becomes one line naming the rank, the bytes asked and the limit.

torch's CPU allocator raises ``RuntimeError: [enforce fail at alloc_cpu.cpp:…] err == 0.
DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes. Error code 12``;
the worker prints one line of it. :func:`as_out_of_memory` turns it into
:class:`~disttrain.comm.errors.OutOfMemory` with what a user needs to act: how much, how
much this process holds and has held, and the per-process limit it ran into (a
``prlimit``/``ulimit`` one: RLIMIT_DATA or RLIMIT_AS), if any.
"""

from __future__ import annotations

import re
import resource

from disttrain.comm.errors import OutOfMemory

__all__ = ["as_out_of_memory"]

_ALLOCATION = re.compile(r"can't allocate memory: you tried to allocate (\d+) bytes")


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.1f} MiB"


def _resident() -> int:
    """This process's resident bytes now (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * resource.getpagesize()
    except (OSError, IndexError, ValueError):
        return 0


def _limits() -> str:
    """The per-process memory limits set on this process, as the flags that set them."""
    found = []
    for name, which in (("data", "RLIMIT_DATA"), ("address space", "RLIMIT_AS")):
        soft, _ = resource.getrlimit(getattr(resource, which))
        if soft != resource.RLIM_INFINITY:
            found.append(f"{name} limit {_mib(soft)} ({which})")
    return "; ".join(found) if found else "no per-process limit: the machine's memory is full"


def as_out_of_memory(exc: BaseException, rank: int) -> OutOfMemory | None:
    """``exc`` as an :class:`OutOfMemory` for ``rank`` if it is a failed allocation, else None."""
    found = _ALLOCATION.search(str(exc))
    if found is None:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kB
    return OutOfMemory(
        f"out of memory on rank {rank}: could not allocate {_mib(int(found.group(1)))} more, "
        f"holding {_mib(_resident())} resident (peak {_mib(peak)}); {_limits()}"
    )
