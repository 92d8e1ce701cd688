"""Through the trainer: N workers at global batch B end with one worker's parameters (1e-5).

The foundation's contract, re-checked with the new engine: fusion, overlap,
accumulation and a point-to-point algorithm on the communication thread.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from tests.harness import SharedWorlds, run_world


def _train(flags: dict[str, Any], out: str) -> dict[str, Any]:
    from disttrain import config
    from disttrain.train.trainer import train

    os.makedirs(out, exist_ok=True)  # the CLI makes it before the workers start
    cfg = config.load(
        {
            **flags,
            "out": out,
            "progress": False,
            "epochs": 1,
            "max_steps": 4,
            "batch_size": 24,
            "model": "tests.strategies.models:small_mlp",
        }
    )
    summary = train(cfg)
    return summary.get("data_parallel", {})


@pytest.mark.timeout(400)  # three short jobs; slow only on a loaded machine
def test_two_workers_match_one_worker(tmp_path: Any) -> None:
    ref = str(tmp_path / "one")
    run_world(_train, 1, args=({"workers": 1}, ref), timeout=90)
    want = torch.load(os.path.join(ref, "model.pt"))
    cases = [
        {"algorithm": "native", "fusion_mb": 25.0, "overlap": False, "accumulate": 3},
        {"algorithm": "ring", "fusion_mb": 0.001, "overlap": True, "accumulate": 2},
    ]
    # both cases one after another in one world of 2 ranks (a spawn costs more than a job)
    runs = SharedWorlds(
        {
            f"case{i}": (2, _train, ({"workers": 2, **c}, str(tmp_path / f"case{i}")))
            for i, c in enumerate(cases)
        },
        timeout=150,
    )
    for i, case in enumerate(cases):
        out = str(tmp_path / f"case{i}")
        stats = runs.get(f"case{i}")
        assert stats[0]["accumulate"] == case.get("accumulate", 1)
        got = torch.load(os.path.join(out, "model.pt"))
        for k in want:
            assert torch.allclose(got[k], want[k], atol=1e-5, rtol=0), (case, k)
