"""``examples/synthetic_benchmark.py`` (Horovod's synthetic benchmark) under ``torchrun``.

It must run on two processes, print one line per iteration and the totals, and its
total must be the per-worker figure times the number of workers (the mean over
ranks comes from ``dt.allreduce`` of a Python number, so every rank agrees).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.ports import free_port
from tests.test_api import TORCHRUN

REPO = Path(__file__).resolve().parents[1]


def test_synthetic_benchmark_runs_under_torchrun(tmp_path: Path) -> None:
    cmd = [
        str(TORCHRUN),
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(REPO / "examples" / "synthetic_benchmark.py"),
        "--num-iters",
        "3",
        "--num-batches-per-iter",
        "2",
        "--fp16-allreduce",
    ]
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO / "src"),
    }
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "workers: 2" in out
    assert len(re.findall(r"^Iter #\d: [\d.]+ samples/sec per worker$", out, re.M)) == 3, out
    per = float(re.search(r"Samples/sec per worker: ([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = float(re.search(r"Total samples/sec on 2 worker\(s\): ([\d.]+)", out).group(1))  # type: ignore[union-attr]
    assert per > 0 and abs(total - 2 * per) <= 0.2, out
