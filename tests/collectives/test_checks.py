"""Ranks that pass different lengths get CollectiveMismatch naming them, not a hang or a crash."""

from __future__ import annotations

from typing import Any

from tests.harness import run_world


def _mismatch() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from disttrain import collectives
    from disttrain.collectives import checks
    from disttrain.comm import CollectiveMismatch, meter

    rank = dist.get_rank()
    errors = {}
    for name in collectives.ALGORITHMS:
        try:
            collectives.all_reduce(torch.ones(10 + (rank == 2) * 3), name)
            errors[name] = ""
        except CollectiveMismatch as exc:
            errors[name] = str(exc)
    # The group is still usable afterwards, and the check meters its own bytes.
    meter.reset()
    x = collectives.all_reduce(torch.ones(5), "ring")
    want = collectives.get("ring").cost(20, 3, rank, 4)
    extra = checks.check_cost_bytes(3)
    return {
        "errors": errors,
        "after": x.tolist(),
        "metered": (meter.bytes_sent, meter.messages_sent),
        "want": (want.bytes_sent + extra[0], want.messages + extra[1]),
    }


def test_different_lengths_raise_on_every_rank_naming_each_length() -> None:
    results = run_world(_mismatch, 3, timeout=150, collective_timeout=20)
    for res in results:
        for name, message in res["errors"].items():
            assert "rank 0: 10" in message and "rank 2: 13" in message, (name, message)
        assert res["after"] == [3.0] * 5
        assert res["metered"] == res["want"]


def _different_calls() -> dict[str, str]:
    import torch
    import torch.distributed as dist

    from disttrain import collectives
    from disttrain.collectives import checks
    from disttrain.comm import CollectiveMismatch
    from disttrain.dataparallel.broadcast import broadcast_tensors

    rank = dist.get_rank()
    checks.set_checks_everywhere(True)  # --check-collectives: broadcasts are checked too
    errors = {}
    cases = {
        # rank 1 broadcasts while the others allreduce: without the check, a hang or garbage
        "broadcast": lambda: broadcast_tensors([torch.ones(10)])
        if rank == 1
        else collectives.all_reduce(torch.ones(10), "ring"),
        # rank 2 runs another algorithm on the same tensor
        "algorithm": lambda: collectives.all_reduce(
            torch.ones(10), "tree" if rank == 2 else "ring"
        ),
        # rank 0 sums float64: the same length, twice the bytes
        "dtype": lambda: collectives.all_reduce(
            torch.ones(10, dtype=torch.float64 if rank == 0 else torch.float32), "ring"
        ),
    }
    for name, call in cases.items():
        try:
            call()
            errors[name] = ""
        except CollectiveMismatch as exc:
            errors[name] = str(exc)
    return errors


def test_a_rank_calling_another_collective_gets_an_error_naming_each_call() -> None:
    results = run_world(_different_calls, 3, timeout=150, collective_timeout=20)
    for errors in results:
        assert "rank 1: broadcast/torch.float32 of 10 elements" in errors["broadcast"]
        assert "rank 0: allreduce/ring/torch.float32 of 10 elements" in errors["broadcast"]
        assert "rank 2: allreduce/tree/torch.float32" in errors["algorithm"]
        assert "rank 0: allreduce/ring/torch.float64" in errors["dtype"]
        assert all(e.startswith("ranks called different collectives") for e in errors.values())
