"""`disttrain bench largebatch`: bad input is refused before any run starts."""

from __future__ import annotations

import pytest

from disttrain.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batches", "32,x"], "comma-separated integers"),
        (["--batches", "33", "--workers", "2"], "positive multiple of --workers 2"),
        (["--extra=--epochs"], "flag-value pairs"),
    ],
)
def test_bad_flags_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "largebatch", *argv]) == 2
    assert message in capsys.readouterr().err
