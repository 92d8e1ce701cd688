"""``disttrain compare`` on a user's own workload: transformers-free and fast, the CSV
regression of examples/workloads.py with the user's MSE, over allreduce, ZeRO-3, local
SGD, DiLoCo, the asynchronous parameter server, decentralized one-bit and the pipeline
(tests/lab/shared_compare.py's run, shared with two other files). The report and its
plots are written, and every figure of the report's results table is the run's own
summary."""

from __future__ import annotations

import json

import pytest

from tests.lab.shared_compare import GROUP, SPECS, STEPS, TIMEOUT, compared


@pytest.mark.xdist_group(GROUP)
@pytest.mark.timeout(TIMEOUT)
def test_compare_reports_a_user_workload_as_its_runs_summaries(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    run = compared(tmp_path_factory)
    out = run.out
    runs = json.loads((out / "runs.json").read_text())
    assert [r["label"] for r in runs] == SPECS
    report = (out / "report.md").read_text()
    for entry in runs:
        own = json.loads((out / entry["folder"] / "summary.json").read_text())
        assert entry["summary"]["final_test_loss"] == own["final_test_loss"]
        assert own["config"]["loss"] == "examples.workloads:mse" and own["steps"] == STEPS
        assert own["config"]["dataset"] == "examples.workloads:regression"
        assert own["final_accuracy"] is None  # a regression: no accuracy made up
        label = entry["label"]
        row = next(line for line in report.splitlines() if line.startswith(f"| {label} |"))
        assert f"{own['final_test_loss']:.4f}" in row, row  # the table shows the run's figure
    assert all((out / f).stat().st_size > 0 for f in ("loss_vs_epoch.png", "report.html"))
