"""``disttrain compare`` on a transformers model (slow: ``make test-long``; its fast sibling
is tests/lab/shared_compare.py's run on the user's CSV regression, in ``make test``).

Issue 49's "Compare on your workload": GPT-2 built from its config (examples/workloads.py,
tied embeddings), the user's Dataset factory (byte-level text, dict batches) and the user's
own loss (``next_byte_loss``), over allreduce, ZeRO-3, local SGD, DiLoCo and the
asynchronous parameter server. The report and its plots are written, and each figure of the
report's results table is that run's own summary. Slow because each of the five runs'
launcher imports transformers (about 4 CPU-s each on this machine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_cli import run_cli

pytestmark = pytest.mark.slow

SPECS = ["allreduce", "zero:3", "localsgd:period=2", "diloco:period=2", "ps:async"]
STEPS = 6


@pytest.mark.timeout(900)
def test_compare_reports_a_transformers_model_as_its_runs_summaries(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    done = run_cli(
        "compare", "--strategies", ",".join(SPECS), "--workers", "2",
        "--model", "examples.workloads:gpt2", "--dataset", "examples.workloads:byte_text",
        "--loss", "examples.workloads:next_byte_loss", "--optimizer", "adam", "--lr", "0.003",
        "--max-steps", str(STEPS), "--batch-size", "16", "--out", str(out),
        "--run-timeout", "400", "--no-progress",
        timeout=840,
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    runs = json.loads((out / "runs.json").read_text())
    assert [r["label"] for r in runs] == SPECS
    report = (out / "report.md").read_text()
    for entry in runs:
        own = json.loads((out / entry["folder"] / "summary.json").read_text())
        assert own["steps"] == STEPS and own["config"]["model"] == "examples.workloads:gpt2"
        assert own["config"]["loss"] == "examples.workloads:next_byte_loss"
        assert entry["summary"]["final_test_loss"] == own["final_test_loss"]
        label = entry["label"]
        row = next(line for line in report.splitlines() if line.startswith(f"| {label} |"))
        assert f"{own['final_test_loss']:.4f}" in row, row  # the table shows the run's figure
    assert all((out / f).stat().st_size > 0 for f in ("loss_vs_epoch.png", "report.html"))
