"""The compare report from synthetic summaries: table rows, time to target, valid PNGs, HTML."""

from __future__ import annotations

import os
from typing import Any

import pytest
from PIL import Image

from disttrain.lab.report import (
    RunResult,
    result_rows,
    speedup_lines,
    time_to_target,
    write_report,
)
from disttrain.lab.report_plots import PLOTS


def _run(
    label: str,
    accuracies: list[float],
    seconds_per_epoch: float,
    bytes_per_epoch: int,
    sps: float = 100.0,
) -> RunResult:
    metrics: list[dict[str, Any]] = []
    for epoch, acc in enumerate(accuracies):
        t = seconds_per_epoch * (epoch + 1)
        sent = bytes_per_epoch * (epoch + 1)
        metrics.append(
            {
                "step": 10 * epoch + 5,
                "epoch": epoch,
                "loss": 2.0 - acc,
                "wall_seconds": t - 1,
                "bytes_sent": sent - 1,
            }
        )  # a step line: ignored
        metrics.append(
            {
                "step": 10 * (epoch + 1),
                "epoch": epoch,
                "test_loss": 2.0 - acc,
                "test_accuracy": acc,
                "wall_seconds": t,
                "bytes_sent": sent,
            }
        )
    summary = {
        "final_accuracy": accuracies[-1],
        "final_test_loss": 2.0 - accuracies[-1],
        "wall_seconds": seconds_per_epoch * len(accuracies) + 0.5,
        "samples_per_second": sps,
        "bytes_sent_per_rank": float(bytes_per_epoch * len(accuracies)),
        "steps": 10 * len(accuracies),
        "metrics": metrics,
    }
    return RunResult(label, {"strategy": label.split(":")[0]}, summary)


DENSE = _run("allreduce:ring", [0.5, 0.85, 0.92, 0.95], 100.0, 40_000_000, sps=20.0)
assert DENSE.summary is not None
# rank 1 is the fullest (pipelines differ by rank); peak RSS is the largest of any rank
DENSE.summary["memory_per_rank"] = {
    "parameters": [4_000_000, 6_000_000],
    "gradients": [4_000_000, 6_000_000],
    "optimizer_state": [8_000_000, 12_000_000],
    "gathered_peak": [0, 0],
    "peak_rss": [310_000_000, 300_000_000],
}
ONEBIT = _run("decentralized:onebit", [0.4, 0.7, 0.88, 0.91], 10.0, 9_000, sps=200.0)
NEVER = _run("localsgd:period=16", [0.3, 0.5, 0.6, 0.7], 20.0, 2_000_000)
FAILED = RunResult("ps:async", {"strategy": "ps"}, None, "ps: rank 1 died")
DENSE.summary["bytes_copied_per_rank"] = 1234.0  # through shared memory (shm)


def test_time_to_target() -> None:
    assert time_to_target(DENSE, 0.9) == (300.0, 3)  # the first epoch at or above the target
    assert time_to_target(DENSE, 0.92) == (300.0, 3)  # reaching it exactly counts
    assert time_to_target(ONEBIT, 0.9) == (40.0, 4)
    assert time_to_target(NEVER, 0.9) is None
    assert time_to_target(FAILED, 0.9) is None


def test_rows_and_ratios() -> None:
    rows = result_rows([DENSE, ONEBIT, NEVER, FAILED], 0.9)
    assert rows[0]["time to 0.9 (s)"] == "300.0 (epoch 3)"
    assert rows[0]["speed-up to target vs first"] == "1.00x"
    assert rows[1]["time to 0.9 (s)"] == "40.0 (epoch 4)"
    assert rows[1]["speed-up to target vs first"] == "7.50x"  # 300 / 40
    assert rows[1]["bytes/rank"] == "36,000" and rows[1]["samples/s"] == "200.0"
    assert rows[0]["copied/rank"] == "1,234" and rows[1]["copied/rank"] == "-"  # none given
    assert rows[1]["final test accuracy"] == "0.9100" and rows[1]["wall s"] == "40.5"
    assert rows[2]["time to 0.9 (s)"] == "not reached"
    assert rows[2]["speed-up to target vs first"] == "-"
    assert rows[3] == {"run": "ps:async", "status": "failed: ps: rank 1 died"}
    assert rows[0]["memory/worker MB"] == "24.0" and rows[0]["peak RSS MB"] == "310.0"
    assert rows[1]["memory/worker MB"] == rows[1]["peak RSS MB"] == "-"  # not counted
    lines = speedup_lines([DENSE, ONEBIT, NEVER, FAILED], 0.9)
    assert "7.50x sooner than allreduce:ring" in lines[1]
    assert lines[2] == "localsgd:period=16 did not reach 0.9 (best 0.7000)."
    assert "failed" in lines[3]
    slower = speedup_lines([ONEBIT, DENSE], 0.9)
    assert "7.50x later" in slower[1]
    assert "no time-to-target ratio" in speedup_lines([NEVER, DENSE], 0.9)[0]


def test_write_report(tmp_path: Any) -> None:
    out = str(tmp_path)
    algorithms = [{"algorithm": "ring", "bytes/rank (meter)": 1572864, "steps (formula)": "6"}]
    paths = write_report(
        out, [DENSE, ONEBIT, NEVER, FAILED], 0.9, {"network": "test"}, algorithms, ["a note"]
    )
    with open(paths["md"]) as fh:
        md = fh.read()
    assert "| allreduce:ring | ok | 0.9500 | 1.0500 | 400.5 | 20.0 | 160,000,000 | " in md
    assert "| 300.0 (epoch 3) | 1.00x | 40 | 24.0 | 310.0 |" in md
    assert "memory.png" in PLOTS and "](memory.png)" in md
    assert "| localsgd:period=16 | ok |" in md and "not reached" in md
    assert "| ps:async | failed: ps: rank 1 died |" in md
    assert "| ring | 1572864 | 6 |" in md and "a note" in md and "- network: test" in md
    for name in PLOTS:
        assert f"]({name})" in md
        with Image.open(os.path.join(out, name)) as img:
            img.verify()  # a whole, valid PNG
        with Image.open(os.path.join(out, name)) as img:
            assert img.format == "PNG" and img.size[0] >= 400 and img.size[1] >= 300
    with open(paths["html"]) as fh:
        page = fh.read()
    assert page.count("src='data:image/png;base64,") == len(PLOTS)  # self-contained
    assert "<td>not reached</td>" in page and "7.50x sooner" in page
    assert os.path.exists(paths["runs"])


@pytest.mark.parametrize("runs", [[FAILED], [NEVER]])
def test_report_without_any_target_reached(tmp_path: Any, runs: list[RunResult]) -> None:
    paths = write_report(str(tmp_path), runs, 0.9, {})
    with open(paths["md"]) as fh:
        assert "no time-to-target ratio" in fh.read()
