"""The communication thread runs work in submission order and hands back results and errors."""

from __future__ import annotations

import pytest
import torch

from disttrain.comm.commthread import CommThread


def test_runs_in_order_and_returns_futures() -> None:
    thread = CommThread()
    seen: list[int] = []

    def work(i: int) -> torch.Tensor:
        seen.append(i)
        return torch.tensor([i])

    futures = [thread.submit(lambda i=i: work(i)) for i in range(20)]
    assert [int(f.wait()) for f in futures] == list(range(20))
    assert seen == list(range(20))
    thread.close()


def test_an_exception_reaches_the_waiter() -> None:
    thread = CommThread()

    def boom() -> torch.Tensor:
        raise ValueError("peer 1 went away")

    fut = thread.submit(boom)
    with pytest.raises(Exception, match="peer 1 went away"):
        fut.wait()
    # nothing more runs on a group after a failed collective: its messages would meet the
    # peers' unfinished one (gloo aborts the process on a size mismatch); the waiter is told
    ran: list[int] = []
    later = thread.submit(lambda: torch.tensor([ran.append(5) or 5]))
    with pytest.raises(Exception, match=r"not run: an earlier collective failed \(peer 1"):
        later.wait()
    assert ran == []
    thread.close()
    with pytest.raises(RuntimeError, match="stopped"):
        thread.submit(lambda: torch.tensor([1]))
