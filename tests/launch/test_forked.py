"""Workers forked from the launcher train exactly as exec'd ones, and are forked.

The reference is ``torchrun -m disttrain train`` (torchrun execs each worker, a fresh
interpreter); ``disttrain train`` with the same flags forks them (the CPU, one thread a
worker). The parameters must be equal bit for bit.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import torch

from disttrain.launch import forked
from tests.ports import free_port
from tests.test_api import TORCHRUN
from tests.test_cli import run_cli

REPO = Path(__file__).resolve().parents[2]
FLAGS = ("--model", "mlp", "--max-steps", "4", "--epochs", "1", "--no-progress", "--timeout", "60")


def test_this_torch_has_the_seam_so_workers_are_forked() -> None:
    with forked.forking(True) as forking:
        assert forking
    with forked.forking(False) as forking:
        assert not forking


def test_forked_workers_train_bit_for_bit_as_torchrun_s_exec_d_ones(tmp_path: Path) -> None:
    cmd = [
        str(TORCHRUN),
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "-m",
        "disttrain",
        "train",
        *FLAGS,
        "--out",
        str(tmp_path / "exec"),
    ]
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO / "src"),
    }
    ran = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=170)
    assert ran.returncode == 0, ran.stderr[-4000:]
    done = run_cli("train", *FLAGS, "--out", str(tmp_path / "forked"))
    assert done.returncode == 0, done.stderr
    a, b = (torch.load(tmp_path / n / "model.pt", weights_only=True) for n in ("exec", "forked"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
