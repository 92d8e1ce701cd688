"""Local SGD: H = 1 equals synchronous data parallelism; H > 1 averages every H steps."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import torch
from torch import nn

from tests.harness import run_world


def tiny_mlp() -> nn.Module:
    """A small digits model so that the equivalence runs take seconds."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def _train(flags: dict[str, Any]) -> dict[str, Any]:
    from disttrain import config
    from disttrain.train.trainer import train

    os.makedirs(flags["out"], exist_ok=True)
    return train(config.load(flags))


def run(tmp: str, name: str, workers: int = 2, **flags: Any) -> tuple[dict[str, Any], str]:
    out = os.path.join(tmp, name)
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
    results = run_world(_train, workers, args=({**base, **flags},), timeout=120)
    return results[0], out


def params(out: str) -> torch.Tensor:
    state = torch.load(os.path.join(out, "model.pt"))
    return torch.cat([v.reshape(-1) for v in state.values()])


@pytest.fixture(scope="module")
def sync(tmp_path_factory: Any) -> tuple[dict[str, Any], str]:
    """Synchronous data parallelism with momentum SGD: the reference."""
    return run(str(tmp_path_factory.mktemp("sync")), "sync", strategy="allreduce")


def test_period_one_equals_synchronous_allreduce(tmp_path: Any, sync: Any) -> None:
    # momentum SGD: the update is linear in gradient and buffer, so averaging
    # after every step reproduces the synchronous run up to fp32 rounding
    summary, local = run(str(tmp_path), "local", strategy="localsgd", period=1)
    torch.testing.assert_close(params(local), params(sync[1]), rtol=0, atol=1e-5)
    assert summary["averaging_rounds"] == 12
    initial = torch.cat([p.reshape(-1) for p in tiny_mlp().state_dict().values()])
    assert (params(local) - initial).abs().max() > 1e-3  # it did train


def test_period_cuts_traffic_by_h(tmp_path: Any, sync: Any) -> None:
    h4, out = run(str(tmp_path), "h4", strategy="localsgd", period=4)
    assert h4["averaging_rounds"] == 3  # steps 4, 8, 12
    assert sync[0]["bytes_sent_per_rank"] / h4["bytes_sent_per_rank"] == pytest.approx(4.0)
    with open(os.path.join(out, "metrics.jsonl")) as fh:
        rounds = [json.loads(line).get("averaging_rounds") for line in fh]
    assert [r for r in rounds if r is not None][:5] == [0, 0, 0, 1, 1]


def test_warmup_then_local_with_optimizer_state(tmp_path: Any) -> None:
    summary, _ = run(
        str(tmp_path), "warm", strategy="localsgd", period=4, warmup_sync_steps=2,
        average_optimizer_state=True,
    )  # fmt: skip
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
