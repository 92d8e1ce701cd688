"""`--strategy allreduce --compression SPEC`: identical replicas, fewer bytes than dense, and a
lossless setting (top-k keeping every entry) trains exactly as dense does."""

from __future__ import annotations

import pytest
import torch

from tests.harness import SharedWorlds


def _train(compression: str) -> tuple[list[torch.Tensor], dict[str, float]]:
    import torch.distributed as dist

    from disttrain import config, strategies
    from disttrain.comm import world
    from disttrain.comm.meter import meter
    from disttrain.train.trainer import loss_fn

    cfg = config.load({"compression": compression, "workers": 3, "batch_size": 48})
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    strategy = strategies.get("allreduce").build(cfg, world.current(), loss_fn)
    strategy.setup(model, optimizer)
    meter.reset()
    torch.manual_seed(1 + dist.get_rank())  # each rank its own data
    for _ in range(5):
        optimizer.zero_grad()
        strategy.forward_backward(torch.randn(16, 8), torch.randint(0, 3, (16,)))
        strategy.after_backward()
        optimizer.step()
    strategy.finish()
    params = [p.detach().clone() for p in model.parameters()]
    return params, {"bytes": meter.bytes_sent, **strategy.summary()}


SPECS = ("onebit:0.01", "topk:0.1")


def _lossless_and_dense() -> list[tuple[list[torch.Tensor], dict[str, float]]]:
    return [_train("topk:1"), _train("none")]


#: the runs of this file in one world of 3 ranks (1 spawn instead of 3: a spawn's start-up
#: costs more than these runs; each builds its own model, seeds and resets the meter)
RUNS = SharedWorlds(
    {**{spec: (3, _train, (spec,)) for spec in SPECS}, "lossless": (3, _lossless_and_dense, ())},
    timeout=240,
)


@pytest.mark.timeout(300)  # the first test runs the shared world
@pytest.mark.parametrize("spec", SPECS)
def test_compressed_allreduce_keeps_replicas_identical_and_sends_less(spec: str) -> None:
    results = RUNS.get(spec)
    first = results[0][0]
    for params, _ in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(first, params, strict=True))
    stats = results[0][1]
    assert stats["payload_compression"] > 3  # sparse payloads: far below dense fp32
    assert stats["residual_norm"] > 0  # error feedback holds what was not sent


@pytest.mark.timeout(300)
def test_topk_keeping_every_entry_trains_as_dense() -> None:
    # topk:1 sends every entry as its fp32 value: the sum is exact up to the order of
    # additions, so its average (sum / n, in dataparallel/average.py) must give dense
    # training's parameters. A wrong divisor (no division: n times the step) would not.
    # Error feedback keeps acc - sent = x - x = 0 exactly: nothing is left out.
    for rank, (lossless, dense) in enumerate(RUNS.get("lossless")):
        params, stats = lossless
        for a, b in zip(params, dense[0], strict=True):
            diff = float((a - b).abs().max())
            assert diff <= 1e-5, f"rank {rank}: lossless top-k differs from dense by {diff:.3g}"
        assert stats["residual_norm"] == 0.0
