"""L0: the checkpoint writer thread: one per process, its tasks run one after another.

``--async-checkpoint`` hands each save (and rank 0's commit of the step before) to this
thread. It does what DCP's ``async_save`` does (a copy of the state taken on the
training path, a plain ``dcp.save`` of that copy in a thread) with two costs of the
training path removed: ``async_save`` copies the state again and starts a new thread
for every save, while the state we hand over is already a private copy
(:func:`dcp.pack`) and this thread lives as long as the process (the effect on a
training run: ``disttrain bench checkpoint-overhead``, benchmarks/RESULTS.md).

One thread, in order: a step's commit, submitted after its save, runs after it, and
the next step's save after that commit (a commit deletes the older staging folders of
its run only, never a newer one).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

__all__ = ["staging", "submit"]

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_last_write: Future[None] | None = None  # the newest task that reads the staging buffers
#: the copy the writer thread writes from, reused from save to save (as DCP's
#: ``cache_staged_state_dict``: one more copy of the state held, for no page faults)
_staging: dict[str, torch.Tensor] = {}


def submit(task: Callable[[], None], reads_staging: bool = False) -> Callable[[], None]:
    """Run ``task`` on the writer thread; return a function that waits for it (and raises
    what it raised). ``reads_staging``: the task writes from :func:`staging`'s buffers."""
    global _executor, _last_write
    with _lock:
        if _executor is None:  # started at the first save: most runs never checkpoint
            _executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="disttrain-checkpoint", initializer=_yield_cpu
            )
        future: Future[None] = _executor.submit(task)
        if reads_staging:
            _last_write = future
    return lambda: future.result()


def _yield_cpu() -> None:
    """Run the writer thread at the lowest CPU priority (nice 19; on Linux ``setpriority``
    of a thread id is that thread's alone), and under SCHED_IDLE where the kernel has it
    (``sched_setscheduler(0, ...)`` is the calling thread's too): where every core trains,
    the write takes the cycles training leaves (waits in collectives) instead of a share
    of a core; a nice-19 thread still gets a slice of a busy core, a SCHED_IDLE one runs
    only when nothing else would (RESULTS "Checkpoints": the steady-state overhead went
    from +5.6 % to +4.4 % and +4.1 %). The price: while it holds the GIL (DCP's Python
    parts) on a machine busy with other jobs, the training thread may wait longer for it
    than under nice 19 alone; the write's I/O and copies run without the GIL."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def staging() -> dict[str, torch.Tensor]:
    """The staging buffers, once the tasks that read them are done (a commit still running
    does not hold them up); a failed task's error is raised by its own wait, not here."""
    last = _last_write
    if last is not None:
        concurrent.futures.wait([last])
    return _staging
