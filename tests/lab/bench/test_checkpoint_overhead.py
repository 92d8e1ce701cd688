"""The checkpoint-overhead bench's steady-state window: whole periods, evaluations left out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disttrain.lab.bench.checkpoint_overhead import steady_rate


def test_steady_rate_counts_the_steps_of_the_window_over_its_training_seconds(
    tmp_path: Path,
) -> None:
    rows = [{"step": s, "loss": 1.0, "wall_seconds": 0.1 * s} for s in range(1, 31)]
    # an evaluation of 0.5 s after step 15 (inside the window) and one after step 25 (not)
    rows.insert(15, {"step": 15, "test_loss": 1.0, "wall_seconds": 1.5 + 0.5})
    rows.insert(26, {"step": 25, "test_loss": 1.0, "wall_seconds": 2.5 + 0.7})
    for r in rows[16:26]:
        r["wall_seconds"] += 0.5  # later steps end later by the evaluation's time
    for r in rows[27:]:
        r["wall_seconds"] += 1.2
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # steps 10..20: 10 steps of 0.1 s; the evaluation after step 15 is not training time
    assert steady_rate(str(path), 10, 20) == pytest.approx(10 / 1.0)
