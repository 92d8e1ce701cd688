"""The parameter server's ``steps`` has one meaning, and its table counts servers apart.

``steps`` is the run's work in synchronous steps: the gradients the servers took
into the budget / workers. With a straggler in async mode the fast worker runs
most of the budget itself, so rank 0's own step count (what ``steps`` used to
be) is far from ``--max-steps``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disttrain.train.progress import title
from tests.test_cli import run_cli


def test_the_title_counts_servers_apart_from_workers() -> None:
    ps = {"strategy": "ps", "world_size": 3, "servers": 1}
    assert title(ps) == "disttrain ps · 2 workers + 1 server"
    assert title({**ps, "world_size": 6, "servers": 2}) == "disttrain ps · 4 workers + 2 servers"
    assert title({"strategy": "allreduce", "world_size": 1}) == "disttrain allreduce · 1 worker"


@pytest.mark.timeout(240)
def test_async_steps_are_the_budget_spent_in_synchronous_steps(tmp_path: Path) -> None:
    done = run_cli(
        "train",
        "--strategy",
        "ps",
        "--ps-mode",
        "async",
        "--workers",
        "2",
        "--servers",
        "1",
        "--model",
        "mlp",
        "--max-steps",
        "12",
        "--straggler",
        "1:4",
        "--timeout",
        "60",
        "--out",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert "disttrain ps · 2 workers + 1 server" in done.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 12
    assert summary["gradients_received"] == 12 * 2  # the budget: steps x workers
    assert sum(summary["worker_steps"].values()) == 12 * 2
    assert summary["worker_steps"]["0"] > 12  # the fast worker ran more than its half
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # metrics.jsonl is rank 0's log, numbered by its own steps (docs/parameter-server.md):
    # every push it made, the last one possibly discarded after the budget was spent
    own = [r["step"] for r in lines if "loss" in r]
    assert own[-1] - summary["worker_steps"]["0"] in (0, 1)
