"""Horovod's collective calls (``disttrain.ops``) against the same sums done by hand.

Three ranks each hold a tensor built from their rank; the expected results are
computed here from those formulas in one process (exact for these small integers
in float arithmetic), so a wrong reduction, order or division fails.
"""

from __future__ import annotations

from typing import Any

import torch

import disttrain as dt
from tests.harness import run_world

N = 3


def _mine(rank: int) -> torch.Tensor:
    return torch.arange(4, dtype=torch.float32) + 10 * rank


def _calls() -> dict[str, Any]:
    r = dt.rank()
    t = _mine(r)
    before = t.clone()
    out = {
        "avg": dt.allreduce(t, average=True),
        "sum": dt.allreduce(t, average=False),
        "max": dt.allreduce(t, op="max"),
        "int_avg": dt.allreduce(torch.tensor([r], dtype=torch.int64), average=True),
        "number": dt.allreduce(float(r + 1), average=True),
        "number_sum": dt.allreduce(r + 1, average=False),
        "gather": dt.allgather(torch.full((r + 1, 2), float(r))),
        "scalar_gather": dt.allgather(torch.tensor(float(r))),
        "bcast": dt.broadcast(t, root_rank=2),
        "unchanged": bool(torch.equal(t, before)),
        "place": (dt.local_rank(), dt.local_size(), dt.cross_rank(), dt.cross_size()),
        "joined": dt.join(),
    }
    dt.allreduce_(t, average=False)
    out["in_place"] = t
    return out


def test_collectives_of_tensors_and_numbers_match_the_sums_by_hand() -> None:
    got = run_world(_calls, N, timeout=90)
    everyone = torch.stack([_mine(r) for r in range(N)])
    rows = torch.cat([torch.full((r + 1, 2), float(r)) for r in range(N)])
    for r, g in enumerate(got):
        assert torch.equal(g["avg"], everyone.mean(0)), r
        assert torch.equal(g["sum"], everyone.sum(0)) and torch.equal(g["in_place"], g["sum"])
        assert torch.equal(g["max"], everyone.max(0).values)
        assert g["int_avg"].dtype == torch.float64 and float(g["int_avg"]) == 1.0
        assert g["number"] == 2.0 and isinstance(g["number"], float)
        assert g["number_sum"] == 6.0
        assert torch.equal(g["gather"], rows)
        assert torch.equal(g["scalar_gather"], torch.tensor([0.0, 1.0, 2.0]))
        assert torch.equal(g["bcast"], _mine(2))
        assert g["unchanged"]
        assert g["place"] == (r, N, 0, 1)
        assert 0 <= g["joined"] < N and g["joined"] == got[0]["joined"]


def test_the_api_names_horovod_users_expect() -> None:
    for name in (
        "allreduce",
        "allgather",
        "broadcast",
        "local_size",
        "cross_rank",
        "cross_size",
        "join",
        "train",
        "train_loop",
    ):
        assert name in dt.__all__ and callable(getattr(dt, name)), name


def _late(late: int) -> int:
    import time

    import disttrain as dt

    dt.join()  # one call first: each call counts its own arrivals
    if dt.rank() == late:
        time.sleep(1.0)
    return dt.join()


def test_join_returns_the_rank_that_arrived_last_on_every_rank() -> None:
    assert run_world(_late, N, args=(1,), timeout=90) == [1] * N
