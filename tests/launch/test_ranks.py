"""``launch.ranks.run``: N processes of one command, each with its own variables; the
first failure stops the others and gives its code; a command that cannot start is one
line (the mechanics behind ``disttrain run -np``, whose kill test is in test_tether)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from disttrain.comm.errors import UsageError
from disttrain.launch import ranks

#: rank R writes its variable to a file; with FAIL, rank 1 exits 3 and the others sleep
_SCRIPT = (
    "import os, sys, time, pathlib\n"
    "r = os.environ['R']\n"
    "pathlib.Path(os.environ['OUT'], r).write_text(os.environ['WHO'])\n"
    "if os.environ.get('FAIL'):\n"
    "    sys.exit(3) if r == '1' else time.sleep(60)\n"
)


def _envs(out: Path, n: int, fail: bool) -> list[dict[str, str]]:
    extra = {"FAIL": "1"} if fail else {}
    return [{"R": str(r), "OUT": str(out), "WHO": f"rank{r}", **extra} for r in range(n)]


@pytest.mark.timeout(60)
def test_each_process_gets_its_own_variables_and_all_zero_gives_zero(tmp_path: Path) -> None:
    assert ranks.run([sys.executable, "-c", _SCRIPT], _envs(tmp_path, 3, False)) == 0
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {
        "0": "rank0",
        "1": "rank1",
        "2": "rank2",
    }


@pytest.mark.timeout(60)
def test_the_first_failure_stops_the_others_and_gives_its_code(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    began = time.monotonic()
    code = ranks.run([sys.executable, "-c", _SCRIPT], _envs(tmp_path, 3, True))
    # the others sleep 60 s: they were stopped (SIGTERM ends a sleeping python at once)
    assert code == 3 and time.monotonic() - began < 30
    assert "rank 1 exited with code 3; stopping the others" in capfd.readouterr().err


def test_a_command_that_cannot_start_is_one_usage_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot start '/nonexistent/x'"):
        ranks.run(["/nonexistent/x"], _envs(tmp_path, 2, False))
