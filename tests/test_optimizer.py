"""DistributedOptimizer: averaged gradients, no_sync accumulation, and uneven inputs via join().

References: one process stepping at the global batch (tolerance 1e-5).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.nn import functional as F

from tests.harness import SharedWorlds

BATCH = 8


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(BATCH, 16, generator=g), torch.randint(0, 4, (BATCH,), generator=g)


def _model() -> torch.nn.Module:
    from disttrain.models import mlp

    torch.manual_seed(0)
    return mlp(16, 4, hidden=(24, 20))


def _reference(steps: int) -> dict[str, torch.Tensor]:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        x, y = _batch(step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model.state_dict()


def _train(algorithm: str, steps_by_rank: list[int], accumulate: bool) -> Any:
    import disttrain as dt

    n, r = dt.size(), dt.rank()
    model = _model()
    if r == 1:  # a different start: broadcast_parameters must fix it
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    opt = dt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(),
        algorithm=algorithm,
        fusion_mb=0.001,
    )
    dt.broadcast_parameters(model.state_dict(), root_rank=0)
    dt.broadcast_optimizer_state(opt, root_rank=0)
    shard = slice(r * BATCH // n, (r + 1) * BATCH // n)
    with opt.join():
        for step in range(steps_by_rank[r]):
            x, y = _batch(step)
            x, y = x[shard], y[shard]
            opt.zero_grad()
            if accumulate:  # two halves, the first without communication
                with opt.no_sync():
                    (F.cross_entropy(model(x[:2]), y[:2]) * 0.5).backward()
                (F.cross_entropy(model(x[2:]), y[2:]) * 0.5).backward()
            else:
                F.cross_entropy(model(x), y).backward()
            opt.step()
    opt.close()
    # numpy, not tensors: tensors cross the result queue as shared memory of a dead process
    momentum = [v["momentum_buffer"].numpy().copy() for v in opt.state_dict()["state"].values()]
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}, momentum


def _max_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    return max(float((torch.as_tensor(a[k]) - torch.as_tensor(b[k])).abs().max()) for k in b)


CASES = [("native", False), ("ring", True)]


@pytest.mark.timeout(300)  # the first test runs the shared world
@pytest.mark.parametrize(("algorithm", "accumulate"), CASES)
def test_distributed_optimizer_trains_like_one_process(algorithm: str, accumulate: bool) -> None:
    results = RUNS.get(f"{algorithm} {accumulate}")
    want = _reference(3)
    for params, _ in results:
        assert _max_diff(params, want) < 1e-5, (algorithm, accumulate)


def _run_registered(algorithm: str, steps: list[int], accumulate: bool) -> Any:
    return _train(algorithm, steps, accumulate)


#: the runs of this file in one world of 2 ranks (1 spawn instead of 3: a spawn's start-up
#: costs more than these runs; each builds its own model and optimizer), the uneven last
RUNS = SharedWorlds(
    {
        **{f"{a} {acc}": (2, _run_registered, (a, [3, 3], acc)) for a, acc in CASES},
        "uneven": (2, _run_registered, ("native", [4, 2], False)),
    },
    timeout=240,
)


@pytest.mark.timeout(300)
def test_uneven_inputs_end_cleanly_with_equal_replicas() -> None:
    # rank 1 runs out after 2 steps, rank 0 trains 4: no hang, and both end equal
    results = RUNS.get("uneven")
    (p0, m0), (p1, m1) = results
    assert _max_diff(p0, p1) == 0.0
    assert len(m0) == len(m1) == 6
    assert all((a == b).all() for a, b in zip(m0, m1, strict=True))
