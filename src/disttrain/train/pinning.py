"""``--pin-cpus``: one worker per CPU."""

from __future__ import annotations

import os

__all__ = ["pin_to_cpu"]


def pin_to_cpu(local_rank: int) -> int | None:
    """Pin this process to one allowed CPU (local rank mod their number); None if not allowed."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
        cpu = cpus[local_rank % len(cpus)]
        os.sched_setaffinity(0, {cpu})
    except (AttributeError, OSError):  # not Linux, or not permitted here
        return None
    return cpu
