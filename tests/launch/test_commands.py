"""launch/commands.py, the one way benchmarks start a training run: its summary with the metrics
lines, from any working directory; a failed run names its command and last line; a command
ends with the process that started it, however that dies."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from disttrain.launch.commands import RunFailed, train_argv, train_run
from tests.launch.test_tether import REPO, _training
from tests.netcheck import alive, descendants, started

#: a benchmark's or compare's part: one training started through launch/commands, waited for
STARTER = (
    "import sys; from disttrain.launch import commands; "
    "commands.start(['train', '--max-steps', '100000', '--no-progress', '--out', sys.argv[1]])"
    ".wait()"
)


@pytest.mark.timeout(180)
def test_a_started_command_and_its_workers_end_when_the_starter_is_killed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    cmd = [sys.executable, "-c", STARTER, str(out)]
    with started(cmd, env=env, start_new_session=True) as (starter, tree):
        _training(out, starter)
        tree[:] = [p for p in descendants(starter.pid) if p != starter.pid]
        assert len(tree) >= 3, tree  # the train command and its two workers
        os.kill(starter.pid, signal.SIGKILL)  # the starter alone: nothing it could forward
        starter.wait(timeout=10)
        deadline = time.monotonic() + 20  # SIGTERM: the command stops its workers first
        while [p for p in tree if alive(p)] and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [p for p in tree if alive(p)]
        assert not left, f"alive 20 s after their starter's SIGKILL: {left}"


@pytest.mark.timeout(120)
def test_a_run_gives_its_summary_and_metrics_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # not the repository: the run still finds this disttrain
    summary = train_argv(["--workers", "1", "--max-steps", "2"], str(tmp_path / "a"))
    assert summary["steps"] == 2 and [m["step"] for m in summary["metrics"] if "loss" in m] == [
        1,
        2,
    ]
    with pytest.raises(RunFailed, match=r"^train --strategy nope: disttrain: error: "):
        train_run({"strategy": "nope"}, out=str(tmp_path / "b"))
