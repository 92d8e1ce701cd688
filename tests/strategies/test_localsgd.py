"""Local SGD: H = 1 equals synchronous data parallelism; H > 1 averages every H steps."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import torch
from torch import nn

from tests.harness import SharedWorlds, run_world


def tiny_mlp() -> nn.Module:
    """A small digits model so that the equivalence runs take seconds."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def _train(flags: dict[str, Any]) -> dict[str, Any]:
    from disttrain import config
    from disttrain.train.trainer import train

    os.makedirs(flags["out"], exist_ok=True)
    return train(config.load(flags))


def _flags(out: str, workers: int, **flags: Any) -> dict[str, Any]:
    base = {
        "workers": workers,
        "model": "tests.strategies.test_localsgd:tiny_mlp",
        "epochs": 1,
        "max_steps": 12,
        "batch_size": 32,
        "lr": 0.1,
        "progress": False,
        "out": out,
    }
    return {**base, **flags}


def run(tmp: str, name: str, workers: int = 2, **flags: Any) -> tuple[dict[str, Any], str]:
    out = os.path.join(tmp, name)
    results = run_world(_train, workers, args=(_flags(out, workers, **flags),), timeout=120)
    return results[0], out


#: the runs of this file: (the summary, the out folder) by name
RUNS: dict[str, dict[str, Any]] = {
    "sync": {"strategy": "allreduce"},  # momentum SGD, synchronous: the reference
    "local": {"strategy": "localsgd", "period": 1},
    "h4": {"strategy": "localsgd", "period": 4},
    "warm": {
        "strategy": "localsgd",
        "period": 4,
        "warmup_sync_steps": 2,
        "average_optimizer_state": True,
    },
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: Any) -> dict[str, tuple[dict[str, Any], str]]:
    """Every run of this file, one after another in one world of 2 ranks (1 spawn instead
    of 4: a spawn's start-up costs more than a run; each builds its own model)."""
    tmp = str(tmp_path_factory.mktemp("localsgd"))
    outs = {name: os.path.join(tmp, name) for name in RUNS}
    shared = SharedWorlds(
        {name: (2, _train, (_flags(outs[name], 2, **flags),)) for name, flags in RUNS.items()},
        timeout=300,
    )
    return {name: (shared.get(name)[0], outs[name]) for name in RUNS}


def params(out: str) -> torch.Tensor:
    state = torch.load(os.path.join(out, "model.pt"))
    return torch.cat([v.reshape(-1) for v in state.values()])


@pytest.mark.timeout(360)  # the first test runs the shared world
def test_period_one_equals_synchronous_allreduce(runs: Any) -> None:
    # momentum SGD: the update is linear in gradient and buffer, so averaging
    # after every step reproduces the synchronous run up to fp32 rounding
    sync, (summary, local) = runs["sync"], runs["local"]
    torch.testing.assert_close(params(local), params(sync[1]), rtol=0, atol=1e-5)
    assert summary["averaging_rounds"] == 12
    initial = torch.cat([p.reshape(-1) for p in tiny_mlp().state_dict().values()])
    assert (params(local) - initial).abs().max() > 1e-3  # it did train


@pytest.mark.timeout(360)
def test_period_cuts_traffic_by_h(runs: Any) -> None:
    sync, (h4, out) = runs["sync"], runs["h4"]
    assert h4["averaging_rounds"] == 3  # steps 4, 8, 12
    assert sync[0]["bytes_sent_per_rank"] / h4["bytes_sent_per_rank"] == pytest.approx(4.0)
    with open(os.path.join(out, "metrics.jsonl")) as fh:
        rounds = [json.loads(line).get("averaging_rounds") for line in fh]
    assert [r for r in rounds if r is not None][:5] == [0, 0, 0, 1, 1]


@pytest.mark.timeout(360)
def test_warmup_then_local_with_optimizer_state(runs: Any) -> None:
    summary, _ = runs["warm"]
    assert summary["sync_steps"] == 2
    assert summary["averaging_rounds"] == 3  # after steps 6 and 10, and at the end (12)
    assert summary["gradient_bytes_per_rank"] > 0
    # momentum buffers are as large as the parameters: averaging them doubles the bytes
    assert summary["optimizer_state_bytes_per_rank"] == summary["parameter_bytes_per_rank"]


def test_bad_period_is_a_usage_error() -> None:
    import disttrain.strategies  # noqa: F401  (registers the localsgd settings)
    from disttrain import config
    from disttrain.comm.errors import UsageError

    with pytest.raises(UsageError, match="--period"):
        config.load({"strategy": "localsgd", "period": 0})
    with pytest.raises(UsageError, match="--warmup-sync-steps"):
        config.load({"strategy": "localsgd", "warmup_sync_steps": -1})


def _lr_of_each_step(optimizer_name: str, warmup: int, scale: bool = True) -> dict[str, Any]:
    """Three local steps of a 2-rank localsgd run: the lr each step ran at (read by a
    pre-hook registered after the strategy's), the user's lr between steps and in the
    optimizer's state_dict, and a step after finish()."""
    from disttrain import config, strategies
    from disttrain.comm import world
    from disttrain.train.trainer import loss_fn

    cfg = config.load(
        {
            "strategy": "localsgd",
            "workers": 2,
            "warmup_sync_steps": warmup,
            "adaptive_lr_scale": scale,
        }
    )
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
    opt = cls[optimizer_name](model.parameters(), lr=0.01)
    strategy = strategies.get("localsgd").build(cfg, world.current(), loss_fn)
    strategy.setup(model, opt)
    seen: list[float] = []
    opt.register_step_pre_hook(lambda o, *_: seen.append(o.param_groups[0]["lr"]))
    between: list[float] = []

    def step(n: int) -> None:
        opt.zero_grad()
        model(torch.randn(4, 3)).square().mean().backward()
        strategy.after_backward()
        opt.step()
        strategy.after_step(n)
        between.append(opt.param_groups[0]["lr"])
        between.append(opt.state_dict()["param_groups"][0]["lr"])

    for n in (1, 2, 3):
        step(n)
    strategy.finish()
    step(4)
    return {"seen": seen, "between": between, "scale": strategy.summary()["local_lr_scale"]}


@pytest.mark.timeout(300)
def test_adaptive_optimizers_step_locally_at_lr_times_sqrt_n_and_keep_their_own_lr() -> None:
    # 2 replicas: √2; the warm-up's synchronous step and a step after finish() at the lr given
    # --no-adaptive-lr-scale: Adam at the lr given
    cases = [("adam", 1, True), ("adamw", 0, True), ("sgd", 0, True), ("adam", 0, False)]
    shared = SharedWorlds(
        {f"{o}:{w}:{on}": (2, _lr_of_each_step, (o, w, on)) for o, w, on in cases}, timeout=240
    )
    root = 2**0.5
    for name, warmup, on in cases:
        got = shared.get(f"{name}:{warmup}:{on}")[0]
        scale = root if on and name != "sgd" else 1.0
        local = [0.01 if n <= warmup else 0.01 * scale for n in (1, 2, 3)]
        assert got["seen"] == pytest.approx([*local, 0.01]), name
        assert got["between"] == [0.01] * 8, name  # the very value, never a rounded one
        assert got["scale"] == pytest.approx(scale), name
