"""A strategy is one file: a plug-in written here is trained, compared and advised on.

The plug-in (a renamed allreduce) is a module in tmp_path named in
``$DISTTRAIN_PLUGINS``; nothing else is edited, and the three commands run as a
user runs them (subprocesses, whose workers inherit the variable).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN = '''
from disttrain.strategies import register
from disttrain.strategies.allreduce import AllReduce


@register
class AllReduce2(AllReduce):
    """The allreduce strategy under another name: a throw-away plug-in."""

    name = "allreduce2"
'''

SRC = Path(__file__).resolve().parents[2] / "src"
SMALL = [
    "--workers",
    "2",
    "--max-steps",
    "2",
    "--epochs",
    "1",
    "--batch-size",
    "32",
    "--dataset",
    "digits",
    "--model",
    "mlp",
    "--no-progress",
]


def _run(tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "dt_plugin_strategy.py").write_text(PLUGIN)
    env = {
        **os.environ,
        "DISTTRAIN_PLUGINS": "dt_plugin_strategy",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(SRC)]),
        **extra,
    }
    return subprocess.run(
        [sys.executable, "-m", "disttrain", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )


@pytest.mark.timeout(400)
def test_plugin_strategy_trains(tmp_path: Path) -> None:
    out = tmp_path / "train"
    proc = _run(tmp_path, "train", "--strategy", "allreduce2", *SMALL, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["strategy"] == "allreduce2"
    assert summary["steps"] == 2 and summary["world_size"] == 2
    # the gradients were averaged: over the wire, or through shared memory (auto's shm)
    assert summary["bytes_sent_per_rank"] + summary["bytes_copied_per_rank"] > 0


@pytest.mark.timeout(400)
def test_plugin_strategy_in_compare(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    proc = _run(
        tmp_path,
        "compare",
        "--strategies",
        "allreduce2:ring",
        *SMALL,
        "--target",
        "0.01",
        "--run-timeout",
        "300",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = json.loads((out / "runs.json").read_text())
    assert [r["label"] for r in runs] == ["allreduce2:ring"]
    summary = runs[0]["summary"]
    assert summary["strategy"] == "allreduce2" and summary["config"]["algorithm"] == "ring"
    assert summary["steps"] == 2
    assert "| allreduce2:ring | ok |" in (out / "report.md").read_text()


def test_plugin_strategy_in_advise(tmp_path: Path) -> None:
    rows_path = tmp_path / "rows.json"
    flags = [
        "advise",
        "--params",
        "1M",
        "--nodes",
        "8",
        "--bandwidth",
        "1gbit",
        "--latency",
        "10us",
        "--json",
        str(rows_path),
    ]
    home = {"XDG_CACHE_HOME": str(tmp_path)}  # no calibration file from the user's home
    proc = _run(tmp_path, *flags, "--strategies", "allreduce2:ring, allreduce:ring", **home)
    assert proc.returncode == 0, proc.stderr
    rows = {r["strategy"]: r for r in json.loads(rows_path.read_text())["rows"]}
    assert set(rows) == {"allreduce2:ring", "allreduce:ring"}
    # the plug-in inherits the allreduce formula: the same prediction under its own name
    assert rows["allreduce2:ring"]["step_seconds"] == rows["allreduce:ring"]["step_seconds"] > 0
    assert rows["allreduce2:ring"]["reason"] == rows["allreduce:ring"]["reason"]
    # and its memory per worker (a whole replica: StrategyCost.predict_memory's default)
    assert rows["allreduce2:ring"]["memory"] == rows["allreduce:ring"]["memory"]
    assert rows["allreduce2:ring"]["memory"]["total"] == 12 * 10**6  # momentum: 12 bytes each
    # and its own default rows (one per algorithm) join advise's table
    proc = _run(tmp_path, *flags, **home)
    assert proc.returncode == 0, proc.stderr
    names = [r["strategy"] for r in json.loads(rows_path.read_text())["rows"]]
    assert {"allreduce2:ring", "allreduce2:tree", "allreduce:ring", "ps:sync"} <= set(names)
