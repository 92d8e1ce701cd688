"""launch/commands.py, the one way benchmarks start a training run: its summary with the metrics
lines, from any working directory; a failed run names its command and last line."""

from __future__ import annotations

from pathlib import Path

import pytest

from disttrain.launch.commands import RunFailed, train_argv, train_run


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
