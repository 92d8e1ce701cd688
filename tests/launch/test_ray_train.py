"""``disttrain train --launcher ray``: a local Ray, two CPU workers, a worker killed and resumed.

One Ray start (the slow part: see docs/launching.md) covers the whole path: Ray
Train's TorchTrainer starts the workers and forms the group, each worker adopts it
and trains, checkpoints go to Ray's storage through its checkpoint API, rank 1 is
killed at step 5, Ray restarts the group (``--max-restarts 1``), the workers resume
from step 3 of the same run, and the summary is printed as usual. The reference is
one process taking the same 6 steps at the same global batch: data parallelism and
an exact resume take the same steps, so the test accuracy must agree to within one
test sample (1/360).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness import run_world
from tests.launch.test_entry import ONE_SAMPLE, SETTINGS, _reference

pytest.importorskip("ray.train.torch", reason="ray[train] is in requirements.lock: make setup")
REPO = Path(__file__).resolve().parents[2]
ENV = {
    **os.environ,
    "PYTHONPATH": str(REPO / "src"),
    "OMP_NUM_THREADS": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def _ray_train(out: Path, *flags: str) -> list[str]:
    """``disttrain train --launcher ray --workers 2 FLAGS`` into ``out``."""
    return [
        sys.executable,
        "-m",
        "disttrain",
        "train",
        "--launcher",
        "ray",
        "--workers",
        "2",
        *flags,
        "--out",
        str(out),
        "--no-progress",
    ]


@pytest.mark.timeout(600)
def test_ray_job_survives_a_killed_worker_and_matches_one_process(tmp_path: Path) -> None:
    want: dict[str, Any] = run_world(_reference, 1, args=(str(tmp_path / "ref"),), timeout=120)[0]
    out = tmp_path / "run"
    cmd = _ray_train(
        out,
        "--max-steps",
        str(SETTINGS["max_steps"]),
        "--batch-size",
        str(SETTINGS["batch_size"]),
        "--epochs",
        "1",
        "--checkpoint-every",
        "3",
        "--max-restarts",
        "1",
        "--inject-fault",
        "kill:rank=1:step=5",
    )
    proc = subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=560)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "final_accuracy" in proc.stdout  # the summary table, as `disttrain train` prints it
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["steps"] == 6
    assert abs(summary["final_accuracy"] - want["final_accuracy"]) <= ONE_SAMPLE
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps.index(4) < len(steps) - 1 - steps[::-1].index(4), steps  # step 4 ran twice
    # each worker's part (a DCP folder) of step 3, through Ray's checkpoint API
    saved = sorted(p.relative_to(out / "ray") for p in (out / "ray").rglob("rank-*") if p.is_dir())
    assert any("step-00000003" in str(p) for p in saved), saved


@pytest.mark.timeout(300)
def test_a_killed_ray_launcher_leaves_no_process(tmp_path: Path) -> None:
    """SIGKILL of the driver once Ray's raylet has started its agents (start-up: not
    waiting for the workers to train keeps the test short): the local Ray's whole tree
    ends within 5 s (launch/reaper.py; without it the raylet's dashboard and runtime-env
    agents ran on for minutes, also when killed while training: 16 processes, measured)."""
    from tests.netcheck import alive, descendants, kill

    def agents_up() -> bool:
        names = set()
        for p in descendants(proc.pid):
            with contextlib.suppress(OSError):
                names.add(Path(f"/proc/{p}/comm").read_text().strip())
        return {"ray::DashboardA", "ray::RuntimeEnv"} <= names

    out = tmp_path / "run"
    # the smallest built-in model: the driver is killed before any worker trains, and the
    # default mlp (6.4M parameters) only makes its pre-flight batch dearer
    cmd = _ray_train(out, "--max-steps", "100000", "--model", "cnn")
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    tree = []
    try:
        deadline = time.monotonic() + 240
        while not agents_up():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
            time.sleep(0.1)
        tree = [p for p in descendants(proc.pid) if p != proc.pid]
        assert len(tree) >= 5, tree  # GCS, raylet, its two agents, the watchdog at least
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while [p for p in tree if alive(p)] and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [p for p in tree if alive(p)]
        assert not left, f"alive 5 s after the Ray launcher's SIGKILL: {left}"
    finally:
        for p in tree:
            kill(p)
        proc.wait()
