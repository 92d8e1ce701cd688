"""Scratch buffers are per thread: a comm thread and the main thread may run algorithms at once.

The reducer and the DDP hooks run allreduce algorithms on a communication thread
(``comm/commthread.py``) while a user may call ``all_reduce(x, "ring")`` on
the main thread. Shared slots would have both receive into one buffer: before the
slots were per thread, the two-thread test below got 4-10 of 30 rounds wrong.
Concurrent calls also need one process group per thread (see ``_two_threads``).
"""

from __future__ import annotations

import threading

import torch

from disttrain.collectives import scratch
from tests.harness import run_world


def test_each_thread_gets_its_own_buffer_and_keeps_it() -> None:
    mine = scratch.buffer("test", 0, 16, torch.float32)
    assert scratch.buffer("test", 0, 8, torch.float32).data_ptr() == mine.data_ptr()  # reused
    theirs: list[torch.Tensor] = []
    again: list[torch.Tensor] = []

    def other() -> None:
        theirs.append(scratch.buffer("test", 0, 16, torch.float32))
        again.append(scratch.buffer("test", 0, 16, torch.float32))

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert theirs[0].data_ptr() != mine.data_ptr()
    assert again[0].data_ptr() == theirs[0].data_ptr()  # reused within that thread too
    # The main thread's slot is untouched by the other thread's calls.
    assert scratch.buffer("test", 0, 16, torch.float32).data_ptr() == mine.data_ptr()


def test_release_frees_every_threads_slots() -> None:
    # Each thread keeps its first buffer alive, so a fresh one after release() cannot
    # land at the same address; without release() the slot hands the same one back.
    ready, released = threading.Event(), threading.Event()
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def other() -> None:
        first = scratch.buffer("test", 1, 1 << 10, torch.float32)
        ready.set()
        released.wait(10)
        seen.append((first, scratch.buffer("test", 1, 1 << 10, torch.float32)))

    thread = threading.Thread(target=other)
    thread.start()
    assert ready.wait(10)
    first = scratch.buffer("test", 1, 1 << 10, torch.float32)
    assert scratch.buffer("test", 1, 1 << 10, torch.float32).data_ptr() == first.data_ptr()
    scratch.release()
    released.set()
    thread.join(10)
    assert scratch.buffer("test", 1, 1 << 10, torch.float32).data_ptr() != first.data_ptr()
    (their_first, their_next) = seen[0]
    assert their_next.data_ptr() != their_first.data_ptr()


LENGTHS = (1 << 20, 3 << 18)  # different per thread, so one thread's slot also grows
ROUNDS = 30


def _two_threads() -> list[int]:
    import torch.distributed as dist

    from disttrain import collectives
    from disttrain.comm import forming

    me = dist.get_rank()
    # One process group per thread, as the reducer's comm thread has its own. On one
    # shared group the two threads' calls pair up across threads (tried: rank 0's
    # thread 0 met rank 1's thread 1, "called with different lengths", or gloo's
    # "Connection reset by peer"), whatever the scratch buffers do.
    groups = [forming.new_group(), forming.new_group()]
    wrong = [0, 0]
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def body(t: int) -> None:
        try:
            n = LENGTHS[t]
            base = torch.arange(n, dtype=torch.float32) % 7
            start.wait(30)
            for i in range(ROUNDS):
                # Integer-valued, so the sum over 2 ranks is exact in fp32.
                x = base + me * 1000 + t * 100 + i
                collectives.all_reduce(x, "ring", groups[t])
                expected = 2 * base + 1000 + 2 * (t * 100 + i)
                wrong[t] += int(not torch.equal(x, expected))
        except BaseException as exc:  # surfaced below, with the thread named
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(t,)) for t in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    if errors:
        raise errors[0]
    return wrong


def test_two_threads_run_rings_at_once() -> None:
    results = run_world(_two_threads, 2, timeout=180)
    assert results == [[0, 0], [0, 0]], f"rounds with a wrong sum per (rank, thread): {results}"
