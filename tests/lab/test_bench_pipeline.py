"""`disttrain bench pipeline`: the schedule printout and bad input (no processes started)."""

from __future__ import annotations

import pytest

from disttrain.cli import main


def test_show_schedule_prints_both_diagrams(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["bench", "pipeline", "--show-schedule", "--stages", "3", "--microbatches", "4"]) == 0
    )
    out = capsys.readouterr().out
    assert "gpipe  M=4 P=3  bubble 0.333" in out
    assert "stage 1  F1 F2 F3 F4  .  .  .  . B1 B2 B3 B4" in out
    assert "stage 1  F1 F2 F3  .  . B1 F4 B2  . B3  . B4" in out  # 1F1B


def test_bad_numbers_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "pipeline", "--stages", "8"]) == 2
    assert "--stages 8" in capsys.readouterr().err
    assert main(["bench", "pipeline", "--microbatches", "3", "--batch", "16"]) == 2
