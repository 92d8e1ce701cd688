"""fp16 on a synchronous parameter server: checkpoints of servers and workers carry one label.

A step skipped on a loss-scale overflow pushes nothing; the servers used to
label their checkpoints by their own round count, so after a skip a server
saved "step 4" into the folder of the workers' step 5, and a skipped checkpoint
step got no server file at all. The workers' step now travels with each push,
and a skipped step is announced (SKIP), so every committed step holds every
rank's file for that step, the servers' shard being the one after that step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disttrain import checkpoint
from tests.test_cli import run_cli


@pytest.mark.timeout(300)
def test_server_and_worker_checkpoints_agree_on_the_step_after_skips(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # 2**22 overflows fp16 gradients: steps skip (x 1/4 each) until the scale fits
    result = run_cli(
        "train",
        "--strategy",
        "ps",
        "--ps-mode",
        "sync",
        "--workers",
        "2",
        "--precision",
        "fp16",
        "--loss-scale",
        "4194304",
        "--scale-backoff",
        "0.25",
        "--checkpoint-every",
        "2",
        "--max-steps",
        "4",
        "--epochs",
        "1",
        "--no-progress",
        "--out",
        str(out),
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    skipped = {r["step"]: r["skipped"] for r in lines if "skipped" in r}
    assert skipped[1] and skipped[2] and not skipped[4], skipped  # step 2 itself skipped
    for step in (2, 4):
        folder = Path(checkpoint.step_dir(str(out), step))
        files = sorted(p.name for p in folder.iterdir())
        # workers 0 and 1, server shard 0, then the commit
        assert files == ["COMMIT", "rank-00000", "rank-00001", "server-00000"], files
        server = checkpoint.load(str(out), "server-00000", 2, step=step)
        assert server["step"] == step
        # the shard after `step` steps: one update per step that was not skipped
        applied = sum(not skipped[s] for s in range(1, step + 1))
        assert server["server"]["version"] == applied, (step, server["server"]["version"])
