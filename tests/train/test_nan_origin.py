"""A NaN is pinned on the rank that computed it, not on a rank whose sum it reached.

With overlap (the allreduce default) the gradients are sent bucket by bucket
during backward; after backward ``p.grad`` on every rank is a view of a bucket
that may already hold the sum, NaN included. Each rank must check its own
bucket before it leaves (the reducer's ``before_send``), so the launcher's one
line names the rank that made the NaN every time. The ``nan`` fault makes the
output of rank 1's first layer NaN in forward, so the NaN reaches the gradients
the way a real fault's does.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from disttrain.dataparallel.fusion import FlatBucket
from disttrain.train.faults import ActivationGuard, NonFiniteGradient, check_bucket, parse_fault
from tests import zygote

REPO = Path(__file__).resolve().parents[2]


#: the strategies whose buckets leave during backward, each run several times: the rank
#: named must not depend on timing (allreduce's reducer; ZeRO-2's reduce-scatter buckets,
#: dataparallel/sharding.py, whose check no other test reached)
RUNS = [("allreduce", ())] * 3 + [("zero", ("--strategy", "zero", "--zero-stage", "2"))] * 2


@pytest.mark.timeout(200)
@pytest.mark.parametrize(("name", "flags"), RUNS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(RUNS)])
def test_nan_in_rank_1_forward_names_rank_1_with_overlap(
    name: str, flags: tuple[str, ...], tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    cmd = [
        sys.executable,
        "-m",
        "disttrain",
        "train",
        "--workers",
        "4",
        "--max-steps",
        "5",
        "--epochs",
        "1",
        "--inject-fault",
        "nan:rank=1:step=3",
        "--no-progress",
        "--timeout",
        "20",
        "--out",
        str(tmp_path / "run"),
        *flags,
    ]
    done = zygote.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=180)
    err = done.stderr
    assert done.returncode == 1, err
    assert "injecting fault nan at step 3" in err, err
    last = err.strip().splitlines()[-1]  # the launcher's one line: the root cause
    # as rank 1 said it (not torch elastic's "To enable traceback see: ..."), then its process
    assert last.startswith("disttrain: error: rank 1: NonFiniteGradient: rank 1 computed"), err
    assert "worker rank 1 (pid" in last and "exited with code 1" in last, err
    assert "traceback" not in last, err
    # rank 1's own line: its first bucket, stopped before it was sent
    assert "rank 1: NonFiniteGradient: rank 1 computed a non-finite gradient for" in err, err
    assert "(bucket 0) at step 3; stopping this worker before sending it" in err, err
    # no other rank blamed itself: the NaN never reached their sums
    for other in (0, 2, 3):
        assert f"rank {other} computed a non-finite" not in err, err


def _bucket(*grads: torch.Tensor) -> tuple[FlatBucket, dict[int, str]]:
    params = [nn.Parameter(torch.zeros_like(g)) for g in grads]
    bucket = FlatBucket.of(4, params)
    for view, g in zip(bucket.views, grads, strict=True):
        view.copy_(g)
    return bucket, {id(p): f"layer{i}.weight" for i, p in enumerate(params)}


def test_check_bucket_names_the_parameter_and_the_bucket() -> None:
    bucket, names = _bucket(torch.ones(3), torch.tensor([1.0, float("inf")]))
    with pytest.raises(NonFiniteGradient, match=r"rank 2 .* layer1\.weight \(bucket 4\) at step 7"):
        check_bucket(bucket, names, rank=2, step=7)
    # huge but finite values overflow the sum; they are not an error
    big, names = _bucket(torch.full((4,), 3e38))
    check_bucket(big, names, rank=0, step=1)


def test_the_nan_fault_poisons_the_first_layer_in_forward_only_when_armed() -> None:
    fault = parse_fault("nan:rank=1:step=3")
    assert fault is not None
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    fault.install(model)
    x = torch.ones(5, 3)
    for step, poisoned in ((2, False), (3, True), (4, True)):
        fault.before_forward(1, step)
        model.zero_grad()
        (model(x) ** 2).sum().backward()  # the loss depends on the output: NaN flows back
        fault.after_forward()
        grads = [p.grad for p in model.parameters()]
        assert all(g is not None and bool(g.isnan().any()) == poisoned for g in grads), step
    fault.before_forward(0, 3)  # another rank: nothing
    assert bool(torch.isfinite(model(x)).all())
    fault.after_forward()
    assert bool(torch.isfinite(model(x)).all())  # evaluation after a step: not poisoned


def test_activation_guard_names_the_layer_that_made_the_nan() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    fault = parse_fault("nan:rank=1:step=1")
    assert fault is not None
    fault.install(model)  # first: the guard's hook sees the poisoned output
    guard = ActivationGuard(model, rank=1)
    guard.begin(1)
    model(torch.ones(2, 3))  # nothing poisoned: passes
    fault.before_forward(1, 1)
    with pytest.raises(NonFiniteGradient, match=r"rank 1 .* activation in 0 \(Linear\) at step 1"):
        model(torch.ones(2, 3))
    fault.after_forward()
    with pytest.raises(NonFiniteGradient, match="non-finite input"):
        model(torch.full((2, 3), float("nan")))
    guard.end()
    assert bool(model(torch.full((2, 3), float("nan"))).isnan().all())  # off outside a step
