"""The prefetching loader yields the same batches as the plain one, and hides a slow loader."""

from __future__ import annotations

import time

import pytest
import torch

from disttrain.data.loader import BatchLoader


def _loader(depth: int, delay: float = 0.0) -> BatchLoader:
    x = torch.arange(40.0).view(20, 2)
    y = torch.arange(20)
    shards = [torch.tensor([i, 19 - i]) for i in range(6)]
    return BatchLoader(x, y, shards, torch.device("cpu"), depth, delay_seconds=delay)


def test_prefetching_yields_exactly_the_plain_batches_in_order() -> None:
    plain = [(x.clone(), y.clone()) for x, y in _loader(0)]
    ahead = list(_loader(3))
    assert len(plain) == len(ahead) == 6
    for (a, b), (c, d) in zip(plain, ahead, strict=True):
        assert torch.equal(a, c) and torch.equal(b, d)


def test_an_error_in_the_loader_thread_reaches_the_training_thread() -> None:
    loader = _loader(2)
    loader.transform = lambda x, y: (_ for _ in ()).throw(ValueError("bad sample"))
    with pytest.raises(ValueError, match="bad sample"):
        list(loader)


def test_stopping_early_leaves_no_loader_thread_behind() -> None:
    import threading

    for i, _ in enumerate(_loader(1, delay=0.01)):
        if i == 1:
            break
    time.sleep(0.1)
    assert not [t for t in threading.enumerate() if t.name == "disttrain-prefetch"]


def test_the_loader_runs_ahead_by_its_depth_while_the_step_is_busy() -> None:
    prepared = []
    loader = _loader(2)
    loader.transform = lambda x, y: (prepared.append(1), (x, y))[1]
    batches = iter(loader)
    next(batches)
    deadline = time.monotonic() + 10
    while len(prepared) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)  # the "step": the loader fills its queue meanwhile
    # one batch handed out, two waiting in the queue, one more blocked on the full queue
    assert len(prepared) == 4
    assert len(list(batches)) == 5
