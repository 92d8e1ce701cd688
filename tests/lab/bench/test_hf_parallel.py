"""`disttrain bench hf-parallel`: a smallest run pairs our pipeline (GPT-2) and tensor plan
(Llama) with torch's anchors, traced and hand-built, on the same computation (the same
step-1 and last-step losses), and bad input is one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from disttrain.lab.bench.hf_parallel import spread
from tests import zygote


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "disttrain", "bench", "hf-parallel", *args]
    return zygote.run(cmd, capture_output=True, text=True, timeout=150)


def test_spread_pairs_rounds_not_medians() -> None:
    # ours is 0.5x, 2x, 0.5x the anchor round by round: paired 0.5, medians 2 and 4
    out = spread([1.0, 8.0, 2.0], [2.0, 4.0, 4.0])
    assert out["paired"] == pytest.approx(0.5) and (out["ours"], out["anchor"]) == (2.0, 4.0)
    assert out["q1"] <= out["paired"] <= out["q3"]


@pytest.mark.timeout(180)
def test_a_smallest_run_pairs_ours_with_each_anchor_on_the_same_losses(tmp_path: Path) -> None:
    flags = ["--rounds", "2", "--batch", "4", "--seq", "16", "--microbatches", "2"]
    done = _bench(*flags, "--parts", "1f1b,tensor", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [(r["part"], r["anchor_kind"]) for r in rows] == [
        ("1f1b", "traced"),
        ("1f1b", "manual"),
        ("tensor", "dtensor"),
    ]
    for r in rows:
        assert "error" not in r, r
        assert len(r["rounds"]["ours"]) == len(r["rounds"]["anchor"]) == 2
        assert r["ours"] > 0 and r["anchor"] > 0 and r["q1"] <= r["paired"] <= r["q3"]
        assert len(r["cpu"]["rounds"]["ours"]) == 2 and r["cpu"]["paired"] > 0
        # the same weights, batch and loss: the same computation (step 1), and the same
        # training after it (tied gradients summed on both sides, the same SGD steps)
        assert 5.0 < r["step1_loss"]["ours"] < 7.5  # about ln(512) = 6.24 at the start
        assert r["step1_loss"]["diff"] < 1e-5, r
        assert r["last_loss"]["diff"] < 1e-4, r
    report = (tmp_path / "report.txt").read_text()
    assert "torch traced" in report and "DTensor parallelize_module" in report


@pytest.mark.parametrize(
    "args",
    [("--parts", "gpipe"), ("--anchor", "export"), ("--microbatches", "3"), ("--seq", "65")],
)
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...]) -> None:
    done = _bench(*args)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
