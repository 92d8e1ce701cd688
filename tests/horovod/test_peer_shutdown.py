"""A rank that shuts down while its peer still calls collectives (2 ranks): the peer's call
fails at once with Horovod's "has been shut down" error instead of waiting for gloo's
timeout, its later calls fail too, and ``hvd.init()`` on both ranks starts a new job
in which collectives work again. This is the order of Horovod's test suite when one
rank's test fails before the other's: that rank's tearDown shuts down first."""

from __future__ import annotations

import time
from typing import Any

import torch

from disttrain.launch.spawn import run_world


def _failing(call: Any) -> tuple[str, float]:
    """(outcome, seconds) of ``call``: the exception's type and message, or "ok"."""
    start = time.monotonic()
    try:
        call()
        outcome = "ok"
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    return outcome, time.monotonic() - start


def _peer_leaves() -> dict[str, Any]:
    import disttrain.horovod as hvd

    got: dict[str, Any] = {}
    hvd.init()
    r = hvd.rank()
    # phase 1: rank 1 leaves while rank 0 allreduces
    if r == 1:
        hvd.shutdown()
    else:
        got["allreduce"] = _failing(lambda: hvd.allreduce(torch.ones(2)))
        got["later"] = _failing(lambda: hvd.barrier())
        got["still_initialized"] = hvd.is_initialized()  # as Horovod: until shutdown()
    hvd.init()  # rank 0: its engine is gone, so this starts again; rank 1: a new job
    got["sum_after_restart"] = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
    # phase 2: rank 0 has joined when rank 1 leaves
    if r == 1:
        hvd.shutdown()
    else:
        got["join"] = _failing(hvd.join)
    hvd.init()
    got["sum_after_second_restart"] = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
    hvd.barrier()
    hvd.shutdown()
    got["initialized_at_end"] = hvd.is_initialized()
    return got


def test_a_peers_shutdown_fails_the_others_calls_and_init_starts_again() -> None:
    gone = "HorovodInternalError: Horovod has been shut down"
    rank0, rank1 = run_world(_peer_leaves, world_size=2, timeout=120, collective_timeout=60)
    outcome, seconds = rank0["allreduce"]
    assert outcome.startswith(gone)
    assert seconds < 20  # not gloo's 60 s timeout: the leaving header answered the call
    assert rank0["later"][0].startswith(gone) and rank0["later"][1] < 1  # nothing is sent
    assert rank0["still_initialized"] is True
    assert rank0["join"][0].startswith(gone)
    for got in (rank0, rank1):
        assert got["sum_after_restart"] == 2.0
        assert got["sum_after_second_restart"] == 2.0
        assert got["initialized_at_end"] is False
