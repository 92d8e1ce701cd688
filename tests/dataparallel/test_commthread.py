"""The communication thread runs work in submission order and hands back results and errors."""

from __future__ import annotations

import pytest
import torch

from disttrain.dataparallel.commthread import CommThread


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
    assert int(thread.submit(lambda: torch.tensor([5])).wait()) == 5  # still serving
    thread.close()
    with pytest.raises(RuntimeError, match="stopped"):
        thread.submit(lambda: torch.tensor([1]))
