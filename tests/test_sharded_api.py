"""``dt.ShardedOptimizer`` / ``dt.shard_model``: ZeRO from a plain script.

The gathered full state (model and optimizer) of every stage equals an unsharded
model with a plain ``torch.optim.Adam`` trained the same steps on the same global
batches, within 1e-5 (the sums differ only in their order: reduce-scatter vs one
process), and loads into them; then the example runs under ``torchrun`` with 2
processes and must equal one process the same way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional as F

import disttrain as dt
from disttrain.comm.errors import UsageError
from tests.harness import SharedWorlds
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).parent / "torchrun"
STEPS, BATCH, HIDDEN, LR = 6, 48, (24, 16), 0.01


def _batches() -> tuple[Any, list[torch.Tensor]]:
    from disttrain.data import GlobalBatchSampler, load_dataset

    data = load_dataset("digits")
    return data, GlobalBatchSampler(len(data.x_train), BATCH, 0, 1, 0).epoch(0)[:STEPS]


def _reference() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """One process, the whole batch, plain Adam: the state every sharded run must reach."""
    from disttrain.models import mlp

    data, batches = _batches()
    torch.manual_seed(0)
    model = mlp(data.in_features, data.num_classes, HIDDEN)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    for indices in batches:
        opt.zero_grad()
        F.cross_entropy(model(data.x_train[indices]), data.y_train[indices]).backward()
        opt.step()
    return model.state_dict(), opt.state_dict()


def _train_sharded(stage: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """On every rank: this rank's slice of each global batch; rank 0 returns the full state."""
    from disttrain.models import mlp

    data, batches = _batches()
    n, r = dt.size(), dt.rank()
    torch.manual_seed(r)  # different on every rank: the broadcast of rank 0's makes them equal
    model = mlp(data.in_features, data.num_classes, HIDDEN)
    if stage == 3:
        model = dt.shard_model(model)
        opt = dt.ShardedOptimizer(model.parameters(), torch.optim.Adam, lr=LR)
    else:
        opt = dt.ShardedOptimizer(
            model.parameters(), torch.optim.Adam, lr=LR, stage=stage, fusion_mb=0.002
        )  # several buckets
    for indices in batches:
        mine = indices[r * BATCH // n : (r + 1) * BATCH // n]
        opt.zero_grad()
        F.cross_entropy(model(data.x_train[mine]), data.y_train[mine]).backward()
        opt.step()
    full = model.full_state_dict() if stage == 3 else model.state_dict()
    optim = opt.full_state_dict()
    opt.close()
    return {k: v.clone() for k, v in full.items()}, optim


def _check(got: tuple[dict[str, torch.Tensor], dict[str, Any]]) -> None:
    from disttrain.models import mlp

    want_model, want_opt = _reference()
    model, optim = got
    assert model.keys() == want_model.keys()
    for k in want_model:
        assert torch.allclose(model[k], want_model[k], atol=1e-5, rtol=0), k
    assert optim["state"].keys() == want_opt["state"].keys()
    for i, entry in want_opt["state"].items():
        assert entry.keys() == optim["state"][i].keys()
        for key, value in entry.items():
            assert torch.allclose(
                optim["state"][i][key].float(), value.float(), atol=1e-5, rtol=0
            ), (i, key)
    # both load into the plain model and the plain optimizer
    data, _ = _batches()
    plain = mlp(data.in_features, data.num_classes, HIDDEN)
    plain.load_state_dict(model)
    torch.optim.Adam(plain.parameters(), lr=LR).load_state_dict(optim)


SHARDED = [(1, 2), (2, 3), (3, 2), (3, 3)]


@pytest.mark.timeout(400)  # the first case of a size runs that world's jobs
@pytest.mark.parametrize(("stage", "n"), SHARDED)
def test_gathered_full_state_equals_an_unsharded_model(stage: int, n: int) -> None:
    """On 3 ranks the chunks are uneven: stage 3's layers of 24·16 + 16 = 400 and
    16·10 + 10 = 170 elements are not divisible by 3, nor are stage 2's buckets."""
    results = RUNS.get(f"stage {stage} on {n}")
    _check(results[0])
    assert results[1][1] == {} and (results[1][0] == {}) == (stage == 3)  # rank 0's alone


def _misuse() -> list[str]:
    from disttrain.models import mlp

    errors = []
    model = dt.shard_model(mlp(64, 10, (8,)))
    for bad in (
        lambda: model.state_dict(),
        lambda: dt.ShardedOptimizer(list(model.parameters())[:1], torch.optim.SGD, lr=0.1),
        lambda: dt.ShardedOptimizer(model.parameters(), torch.optim.SGD, lr=0.1, stage=2),
        lambda: dt.ShardedOptimizer(mlp(4, 2, (3,)).parameters(), torch.optim.SGD, stage=3),
        lambda: dt.shard_model(model),
    ):
        try:
            bad()
        except UsageError as exc:
            errors.append(str(exc))
    return errors


#: the runs of this file in one world per size (2 spawns instead of 5: a spawn's start-up
#: costs more than a run; each builds its own model and optimizer). The misuse last: it
#: leaves a sharded model behind.
RUNS = SharedWorlds(
    {
        **{f"stage {stage} on {n}": (n, _train_sharded, (stage,)) for stage, n in SHARDED},
        "misuse": (2, _misuse, ()),
    },
    timeout=350,
)


@pytest.mark.timeout(400)
def test_misuse_is_one_clear_error() -> None:
    errors = RUNS.get("misuse")[0]
    assert len(errors) == 5, errors
    assert "full_state_dict()" in errors[0] and "model.parameters()" in errors[1]
    assert "stage 3" in errors[2] and "dt.shard_model(model) first" in errors[3]


@pytest.mark.timeout(200)
def test_the_example_under_torchrun_equals_one_process(tmp_path: Path) -> None:
    out = tmp_path / "state.pt"
    cmd = [
        str(TORCHRUN),
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "examples/sharded_zero.py",
        "--stage",
        "3",
        "--max-steps",
        str(STEPS),
        "--batch-size",
        str(BATCH),
        "--lr",
        str(LR),
        "--hidden",
        ",".join(map(str, HIDDEN)),
        "--out",
        str(out),
    ]
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}",
    }
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert f"rank 0: {STEPS} steps" in proc.stdout and "world size 2, stage 3" in proc.stdout
    saved = torch.load(out, weights_only=True)
    _check((saved["model"], saved["optimizer"]))
