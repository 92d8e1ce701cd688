"""tests/zygote.py runs ``python -m disttrain`` as exec would: the same exit code and
output for a refused command, a model module found beside the command (its folder first
on sys.path, as ``python -m`` puts it), and a kill seen as -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import zygote

REPO = Path(__file__).resolve().parents[1]
CMD = [sys.executable, "-m", "disttrain", "train"]


@pytest.mark.timeout(180)
def test_a_forked_command_answers_as_an_execd_one(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), zygote._OFF: "0"}
    (tmp_path / "zymodels.py").write_text(
        "from torch import nn\n\ndef make(in_features, num_classes):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, num_classes))\n"
    )
    one_step = ["--workers", "1", "--max-steps", "1", "--no-progress"]
    cases = [
        ["--workers", "0"],
        ["--model", "zymodels:nope", *one_step],
        ["--model", "zymodels:make", *one_step],
    ]
    for argv in cases:
        args = [*argv, "--out", str(tmp_path / "out"), "--overwrite"]
        forked = zygote.run(
            [*CMD, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        execd = subprocess.run(
            [*CMD, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert forked.returncode == execd.returncode, (argv, forked.stderr, execd.stderr)
        assert forked.stderr == execd.stderr or forked.returncode == 0, argv
    assert (
        execd.returncode == 0 and "zymodels:make" in (tmp_path / "out" / "summary.json").read_text()
    )
    proc = zygote.popen(
        [*CMD, "--max-steps", "100000", "--no-progress", "--out", str(tmp_path / "long")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    assert isinstance(proc, zygote.Command)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -9
