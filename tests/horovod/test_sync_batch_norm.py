"""hvd.SyncBatchNorm on 2 ranks against one torch BatchNorm on the concatenated batch.

Each rank holds its slice of a fixed random global batch (3 and 5 samples, 5 and 3, and
0 and 6: an empty rank); after two training steps the output, the input's gradient, the
weight's and bias's gradients summed over the ranks (Horovod's rule: the optimizer's
allreduce adds them), running_mean, running_var and num_batches_tracked must equal the
reference's. Tolerance, absolute: 1e-5 in float32 (observed: at most 1e-6), 1e-10 in
float64 (observed: 3e-15). One world for every case (a world costs more than the checks).
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
import torch
import torch.distributed as dist

from tests.harness import run_world

#: name: (global shape, rows on rank 0 and 1, dtype, momentum)
CASES: dict[str, tuple[tuple[int, ...], tuple[int, int], torch.dtype, float | None]] = {
    "2d": ((8, 4), (3, 5), torch.float32, 0.1),
    "4d": ((8, 3, 2, 2), (3, 5), torch.float32, 0.1),
    "4d_float64_cumulative": ((8, 3, 2, 2), (5, 3), torch.float64, None),
    "3d_empty_rank": ((6, 4, 3), (0, 6), torch.float32, 0.1),
}
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def _maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).detach().abs().max()) if a.numel() else 0.0


def _reference(shape: tuple[int, ...], **kwargs: Any) -> torch.nn.Module:
    cls = torch.nn.BatchNorm2d if len(shape) == 4 else torch.nn.BatchNorm1d
    return cls(shape[1], **kwargs)


def _train(rank: int, name: str) -> dict[str, float]:
    """Two training steps of one case; the largest absolute difference of each quantity."""
    import disttrain.horovod as hvd

    shape, rows, dtype, momentum = CASES[name]
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    sync = hvd.SyncBatchNorm(shape[1], momentum=momentum).to(dtype)
    ref = _reference(shape, momentum=momentum).to(dtype)
    with torch.no_grad():  # the same weight and bias, not the trivial 1 and 0
        weight, bias = (
            torch.rand(shape[1], generator=gen) + 0.5,
            torch.randn(shape[1], generator=gen),
        )
        for bn in (sync, ref):
            bn.weight.copy_(weight)
            bn.bias.copy_(bias)
    lo, hi = sum(rows[:rank]), sum(rows[: rank + 1])
    err: dict[str, float] = {}

    def note(key: str, value: float) -> None:
        err[key] = max(err.get(key, 0.0), value)

    for _ in range(2):
        x_all = torch.randn(shape, generator=gen, dtype=dtype) * 3 + 1  # mean far from 0
        dy_all = torch.randn(shape, generator=gen, dtype=dtype)  # d loss / d output
        x = x_all[lo:hi].clone().requires_grad_()
        y = sync(x)
        (y * dy_all[lo:hi]).sum().backward()
        x_ref = x_all.clone().requires_grad_()
        y_ref = ref(x_ref)
        (y_ref * dy_all).sum().backward()
        note("output", _maxdiff(y, y_ref[lo:hi]))
        assert x.grad is not None and x_ref.grad is not None
        note("input_grad", _maxdiff(x.grad, x_ref.grad[lo:hi]))
        for p, q in ((sync.weight, ref.weight), (sync.bias, ref.bias)):
            note("weight_bias_grad", _maxdiff(hvd.allreduce(p.grad, op=hvd.Sum), q.grad))
            p.grad = q.grad = None
    note("running_mean", _maxdiff(sync.running_mean, ref.running_mean))
    note("running_var", _maxdiff(sync.running_var, ref.running_var))
    note("batches_differ", float(int(sync.num_batches_tracked) != int(ref.num_batches_tracked)))
    note("batches", float(sync.num_batches_tracked))
    return err


def _eval(rank: int) -> dict[str, Any]:
    """Eval: running statistics with no communication; without them, the global batch."""
    import disttrain.horovod as hvd

    shape, rows = (8, 3, 2, 2), (3, 5)
    gen = torch.Generator().manual_seed(7)
    x_all = torch.randn(shape, generator=gen) * 2 - 1
    lo, hi = sum(rows[:rank]), sum(rows[: rank + 1])
    x = x_all[lo:hi]
    sync, ref = hvd.SyncBatchNorm(3).eval(), torch.nn.BatchNorm2d(3).eval()
    with torch.no_grad():
        for bn in (sync, ref):
            bn.running_mean.copy_(torch.tensor([0.5, -1.0, 2.0]))
            bn.running_var.copy_(torch.tensor([0.25, 4.0, 1.5]))
    got: dict[str, Any] = {}
    with mock.patch.object(dist, "all_reduce", side_effect=AssertionError("communicated")):
        got["eval"] = _maxdiff(sync(x), ref(x_all)[lo:hi])
    untracked = hvd.SyncBatchNorm(3, track_running_stats=False).eval()
    plain = torch.nn.BatchNorm2d(3, track_running_stats=False).eval()
    got["eval_untracked"] = _maxdiff(untracked(x), plain(x_all)[lo:hi])
    try:  # one value per channel over all ranks: torch's ValueError, on every rank
        hvd.SyncBatchNorm(4)(torch.ones(1 - rank, 4))
        got["one_value"] = "no error"
    except ValueError as exc:
        got["one_value"] = str(exc)
    return got


def _world() -> dict[str, Any]:
    import disttrain.horovod as hvd

    hvd.init()
    rank = hvd.rank()
    got: dict[str, Any] = {name: _train(rank, name) for name in CASES}
    got.update(_eval(rank))
    hvd.shutdown()
    return got


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_world(_world, world_size=2, timeout=150, collective_timeout=30)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", list(CASES))
def test_training_equals_one_batch_norm_on_the_global_batch(
    results: list[dict[str, Any]], name: str
) -> None:
    tol = TOL[CASES[name][2]]
    for rank, got in enumerate(results):
        err = got[name]
        for key in ("output", "input_grad", "weight_bias_grad", "running_mean", "running_var"):
            assert err[key] < tol, (rank, key, err[key])
        assert err["batches_differ"] == 0.0 and err["batches"] == 2.0


@pytest.mark.timeout(180)
def test_eval_uses_running_stats_without_communication(results: list[dict[str, Any]]) -> None:
    for got in results:
        assert got["eval"] < 1e-6
        assert got["eval_untracked"] < 1e-5  # no running stats: the global batch's


@pytest.mark.timeout(180)
def test_one_value_per_channel_over_all_ranks_is_refused_everywhere(
    results: list[dict[str, Any]],
) -> None:
    for got in results:
        assert "Expected more than 1 value per channel" in got["one_value"]


def test_input_below_2d_is_horovods_value_error() -> None:
    import disttrain.horovod as hvd

    with pytest.raises(ValueError, match=r"expected at least 2D input \(got 1D input\)"):
        hvd.SyncBatchNorm(3)(torch.ones(3))


def test_eval_needs_no_init_and_is_a_plain_batch_norm() -> None:
    import disttrain.horovod as hvd

    x = torch.randn(4, 3, 5)
    sync, ref = hvd.SyncBatchNorm(3, momentum=None).eval(), torch.nn.BatchNorm1d(3).eval()
    assert torch.equal(sync(x), ref(x))
    assert isinstance(sync, torch.nn.modules.batchnorm._BatchNorm)
