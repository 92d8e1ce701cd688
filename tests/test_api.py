"""The Horovod-style API in a real ``torchrun`` job: two processes train as one would.

``examples/horovod_style.py`` runs under ``torchrun --nproc-per-node 2`` (its
rendezvous on 127.0.0.1) for a few steps; its final parameters must equal those
of one process taking the same steps at the same global batch within 1e-5,
which is what ``disttrain train`` guarantees for its own workers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

import disttrain as dt
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).parent / "torchrun"
STEPS, BATCH, HIDDEN = 4, 32, (32, 16)


def _single_process_reference() -> dict[str, torch.Tensor]:
    from disttrain.data import GlobalBatchSampler, load_dataset
    from disttrain.models import mlp

    data = load_dataset("digits")
    torch.manual_seed(0)
    model = mlp(data.in_features, data.num_classes, HIDDEN)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = GlobalBatchSampler(len(data.x_train), BATCH, 0, 1, 0)
    for indices in sampler.epoch(0)[:STEPS]:
        opt.zero_grad()
        F.cross_entropy(model(data.x_train[indices]), data.y_train[indices]).backward()
        opt.step()
    return model.state_dict()


def _torchrun(tmp_path: Path, *extra: str) -> dict[str, torch.Tensor]:
    out = tmp_path / "model.pt"
    cmd = [
        str(TORCHRUN),
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "examples/horovod_style.py",
        "--max-steps",
        str(STEPS),
        "--batch-size",
        str(BATCH),
        "--hidden",
        ",".join(map(str, HIDDEN)),
        "--out",
        str(out),
        *extra,
    ]
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}",
    }
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert f"rank 0: {STEPS} steps" in proc.stdout
    return torch.load(out)


def test_public_api_is_the_horovod_surface() -> None:
    for name in (
        "init",
        "rank",
        "size",
        "local_rank",
        "DistributedOptimizer",
        "broadcast_parameters",
        "broadcast_optimizer_state",
        "ShardedOptimizer",
        "shard_model",
    ):
        assert name in dt.__all__ and callable(getattr(dt, name))


def test_torchrun_two_processes_train_like_one_process(tmp_path: Path) -> None:
    got = _torchrun(tmp_path, "--fusion-mb", "0.001")
    want = _single_process_reference()
    assert got.keys() == want.keys()
    for k in want:
        assert torch.allclose(got[k], want[k], atol=1e-5, rtol=0), k
