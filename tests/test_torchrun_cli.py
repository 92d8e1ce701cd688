"""``torchrun -m disttrain train`` without ``--out``: every rank writes into one shared folder."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.ports import free_port
from tests.test_api import TORCHRUN

REPO = Path(__file__).resolve().parents[1]


def test_all_ranks_of_a_torchrun_job_share_the_default_out_folder(tmp_path: Path) -> None:
    # Before, only rank 0 got a default folder: rank 1's checkpoint files went nowhere
    # (or into the working directory). The job's rendezvous id now names the folder.
    cmd = [
        str(TORCHRUN),
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "--rdzv-id",
        "job7",
        "-m",
        "disttrain",
        "train",
        "--max-steps",
        "4",
        "--epochs",
        "1",
        "--checkpoint-every",
        "2",
        "--no-progress",
        "--timeout",
        "60",
    ]
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO / "src"),
    }
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert runs == ["torchrun-job7-allreduce"], runs
    out = tmp_path / "runs" / runs[0]
    assert (out / "summary.json").is_file()
    ranks = sorted(p.name for p in out.glob("checkpoints/step-*/rank-*"))
    assert ranks and {"rank-00000", "rank-00001"} <= set(ranks), ranks
    assert not (tmp_path / "checkpoints").exists()
