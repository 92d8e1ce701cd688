"""checkpoint.background: one low-priority writer thread, tasks in order, errors at their wait."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from disttrain.checkpoint import background


def test_tasks_run_in_order_on_one_thread_and_errors_surface_at_their_wait() -> None:
    seen: list[tuple[str, int]] = []

    def task(name: str, pause: float) -> None:
        time.sleep(pause)
        seen.append((name, threading.get_native_id()))

    waits = [
        background.submit(lambda: task("save", 0.05), reads_staging=True),
        background.submit(lambda: task("commit", 0.0)),
    ]

    def fail() -> None:
        raise OSError("disk full")

    failed = background.submit(fail)
    for wait in waits:
        wait()
    assert [name for name, _ in seen] == ["save", "commit"]  # the commit waited for the save
    assert seen[0][1] == seen[1][1] != threading.get_native_id()
    with pytest.raises(OSError, match="disk full"):
        failed()


def test_the_writer_runs_at_the_lowest_priority() -> None:
    niceness: list[int] = []
    policy: list[int] = []
    background.submit(lambda: niceness.append(os.getpriority(os.PRIO_PROCESS, 0)))()
    background.submit(lambda: policy.append(os.sched_getscheduler(0)))()
    # PRIO_PROCESS 0 (and sched_*scheduler(0)) is the calling thread on Linux: the
    # writer's own, not the process's
    assert niceness == [19] and os.getpriority(os.PRIO_PROCESS, 0) < 19
    assert policy == [os.SCHED_IDLE] and os.sched_getscheduler(0) != os.SCHED_IDLE


def test_the_staging_buffers_are_handed_out_only_once_their_write_is_done() -> None:
    release, commit_done = threading.Event(), threading.Event()
    done: list[bool] = []

    def write() -> None:
        release.wait(5)
        done.append(True)

    background.submit(write, reads_staging=True)
    commit = background.submit(lambda: commit_done.wait(5))  # a slow commit: not waited for
    threading.Timer(0.1, release.set).start()
    start = time.monotonic()
    buffers = background.staging()
    assert done == [True] and time.monotonic() - start < 4
    assert isinstance(buffers, dict) and all(isinstance(t, torch.Tensor) for t in buffers.values())
    commit_done.set()
    commit()
