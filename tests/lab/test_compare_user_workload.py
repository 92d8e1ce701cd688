"""``disttrain compare`` on a user's own workload: transformers-free and fast, the CSV
regression of examples/workloads.py with the user's MSE, over allreduce, ZeRO-3, local
SGD, DiLoCo and the asynchronous parameter server. The report and its plots are
written, and every figure of the report's results table is the run's own summary."""

from __future__ import annotations

import json
from pathlib import Path

from tests.test_cli import run_cli

STRATEGIES = "allreduce,zero:3,localsgd,diloco,ps:async"


def test_compare_reports_a_user_workload_as_its_runs_summaries(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    done = run_cli(
        "compare", "--strategies", STRATEGIES,
        "--dataset", "examples.workloads:regression", "--model", "examples.workloads:regressor",
        "--loss", "examples.workloads:mse", "--optimizer", "adam", "--lr", "0.01",
        "--max-steps", "6", "--batch-size", "32", "--out", str(out), "--no-progress",
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads((out / "runs.json").read_text())
    assert [r["label"] for r in runs] == STRATEGIES.split(",")
    report = (out / "report.md").read_text()
    for run in runs:
        own = json.loads((out / run["folder"] / "summary.json").read_text())
        assert run["summary"]["final_test_loss"] == own["final_test_loss"]
        assert own["config"]["loss"] == "examples.workloads:mse" and own["steps"] == 6
        row = next(line for line in report.splitlines() if line.startswith(f"| {run['label']} |"))
        assert f"{own['final_test_loss']:.4f}" in row, row  # the table shows the run's figure
    assert all((out / f).stat().st_size > 0 for f in ("loss_vs_epoch.png", "report.html"))
