"""A throw-away allreduce algorithm in one file is picked up by train, bench, compare and advise.

The plug-in is a renamed ring written to a temporary folder and named in
``$DISTTRAIN_PLUGINS``: every process the commands start (workers included)
registers it exactly as a built-in algorithm file registers itself. Nothing in
the library is edited, which is the point (issue 15, item 1). A renamed ring
sends what the ring sends, so each command's row for ``ring2`` must equal ring's.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

import disttrain
from tests import zygote

MODULE = "disttrain_test_ring2"
PLUGIN = '''"""The ring under another name: the whole of a new algorithm's file."""

from dataclasses import replace

from disttrain.collectives import ALGORITHMS, register
from disttrain.collectives.ring import Ring


class Ring2(Ring):
    name = "ring2"


register(replace(ALGORITHMS.get("ring"), runtime=Ring2))  # ring's facts and cost terms
'''


def _plugin(folder: Path) -> dict[str, str]:
    """Write the plug-in into ``folder``; the environment that loads it in every process."""
    (folder / f"{MODULE}.py").write_text(PLUGIN)
    src = os.path.dirname(os.path.dirname(os.path.abspath(disttrain.__file__)))
    path = os.pathsep.join(p for p in (str(folder), src, os.environ.get("PYTHONPATH")) if p)
    return {
        **os.environ,
        "PYTHONPATH": path,
        "DISTTRAIN_PLUGINS": MODULE,
        "XDG_CACHE_HOME": str(folder / "cache"),  # advise: no calibration file of the user's
        "PYTHONUNBUFFERED": "1",
    }


def _disttrain(env: dict[str, str], *argv: str, timeout: float) -> str:
    # forked from the test process's zygote (torch imported once), the command as it runs:
    # its own environment, PYTHONPATH and DISTTRAIN_PLUGINS
    done = zygote.run(
        [sys.executable, "-m", "disttrain", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_plugin_owns_its_path_and_table_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from disttrain import collectives
    from disttrain.collectives.paths import critical_path, steps_formula
    from disttrain.lab.compare import table_algorithms

    _plugin(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        importlib.import_module(MODULE)
        assert "ring2" in collectives.ALGORITHMS and collectives.ALGORITHMS.names()[-1] == "ring2"
        assert type(collectives.get("ring2")).__name__ == "Ring2"
        for n in (2, 3, 5, 8, 100):
            assert steps_formula("ring2", n) == steps_formula("ring", n)
            for nbytes in (4, 4000, 12345 * 4):
                assert critical_path("ring2", nbytes, n, 4) == critical_path("ring", nbytes, n, 4)
        # the seed table inherits ring's place; the others keep theirs
        assert table_algorithms() == [
            "star",
            "tree",
            "butterfly",
            "ring",
            "ring2",
            "shm",
            "hierarchical",
        ]
    finally:
        collectives.ALGORITHMS.remove("ring2")
        sys.modules.pop(MODULE, None)
        critical_path.cache_clear()
    assert "ring2" not in collectives.ALGORITHMS


@pytest.mark.timeout(240)
def test_bench_allreduce_measures_the_plugin(tmp_path: Path) -> None:
    env = _plugin(tmp_path)
    out = tmp_path / "bench.json"
    _disttrain(
        env,
        "bench",
        "allreduce",
        "--workers",
        "2",
        "--sizes",
        "4KB",
        "--algorithms",
        "ring,ring2",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--no-progress",
        "--json",
        str(out),
        timeout=200,
    )
    rows = {r["algorithm"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["native", "ring", "ring2"]
    for key in ("bytes_sent_measured", "bytes_sent_theory", "messages_measured"):
        assert rows["ring2"][key] == rows["ring"][key] > 0, key
    assert rows["ring2"]["bytes_sent_measured"] == rows["ring2"]["bytes_sent_theory"]
    assert rows["ring2"]["estimated"] is False and rows["native"]["estimated"] is True


def _table_row(report: str, algorithm: str) -> list[str]:
    row = next(line for line in report.splitlines() if line.startswith(f"| {algorithm} |"))
    return [c.strip() for c in row.strip("|").split("|")]


@pytest.mark.timeout(600)
def test_train_and_compare_algorithms_table_run_the_plugin(tmp_path: Path) -> None:
    """compare runs `disttrain train --strategy allreduce --algorithm ring2` as a subprocess."""
    env = _plugin(tmp_path)
    out = tmp_path / "cmp"
    _disttrain(
        env,
        "compare",
        "--strategies",
        "allreduce:ring, allreduce:ring2",
        "--workers",
        "2",
        "--epochs",
        "1",
        "--max-steps",
        "2",
        "--batch-size",
        "32",
        "--target",
        "0.01",
        "--algorithms-table",
        "--table-size",
        "4KB",
        "--run-timeout",
        "240",
        "--no-progress",
        "--out",
        str(out),
        timeout=560,
    )
    runs: list[dict[str, Any]] = json.loads((out / "runs.json").read_text())
    ring, ring2 = (r["summary"] for r in runs)
    assert ring2["config"]["algorithm"] == "ring2" and ring2["steps"] == 2
    assert ring2["world_size"] == 2
    assert ring2["bytes_sent_per_rank"] == ring["bytes_sent_per_rank"] > 0
    report = (out / "report.md").read_text()
    # the algorithms table: ring2's bytes and messages (metered and cost()) equal ring's
    mine, theirs = _table_row(report, "ring2"), _table_row(report, "ring")
    assert mine[1:9] == theirs[1:9]  # all but the name and the time
    assert (mine[3], mine[6]) == (mine[5], mine[7])  # metered == cost() (no length check)
    assert mine[1] == "2" and mine[8] == "2"  # 2 ranks, 2(n-1) steps


def test_advise_ranks_the_plugin(tmp_path: Path) -> None:
    env = _plugin(tmp_path)
    out = tmp_path / "advise.json"
    _disttrain(
        env,
        "advise",
        "--params",
        "1M",
        "--nodes",
        "8",
        "--bandwidth",
        "10Gbit",
        "--latency",
        "5us",
        "--strategies",
        "allreduce:ring,allreduce:ring2",
        "--json",
        str(out),
        timeout=120,
    )
    rows = {r["strategy"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"allreduce:ring", "allreduce:ring2"}
    ring, ring2 = rows["allreduce:ring"], rows["allreduce:ring2"]
    for key in ("step_seconds", "comm_seconds", "bytes_per_rank", "messages_per_rank", "reason"):
        assert ring2[key] == ring[key], key
    assert ring2["bytes_per_rank"] > 0
