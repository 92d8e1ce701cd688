"""Run `disttrain train` from benchmarks: in a subprocess, returning its summary.json.

The one way a benchmark or report starts a training run: :func:`train_run` (flags as a
dict) and :func:`train_argv` (flags as the command line writes them). Each run uses the
``disttrain`` package this module belongs to (its folder leads PYTHONPATH), whatever the
caller's working directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["RunFailed", "RunResult", "train_argv", "train_run"]

#: the folder holding the ``disttrain`` package that runs this module: its runs use it too
SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class RunFailed(RuntimeError):
    """A benchmark's training run exited non-zero."""


@dataclass
class RunResult:
    """One run of a comparison: the spec as written, its train flags, its summary or its error."""

    label: str
    flags: dict[str, Any]
    summary: dict[str, Any] | None = None  # summary.json, plus "metrics": metrics.jsonl's lines
    error: str = ""
    folder: str = ""  # the run's --out, kept (compare: REPORT/runs/run-NN)

    @property
    def evaluations(self) -> list[dict[str, Any]]:
        """The epoch-end lines of metrics.jsonl (the ones with a test loss)."""
        metrics = (self.summary or {}).get("metrics", [])
        return [m for m in metrics if "test_loss" in m]


def train_run(
    flags: dict[str, Any], timeout: float = 1800, launcher: Sequence[str] = (), out: str = ""
) -> dict[str, Any]:
    """``disttrain train`` with ``flags`` (name -> value; True for a bare switch); its summary.

    ``launcher`` is a command the train command is appended to, e.g.
    ``disttrain cluster run --`` to run it as a multi-node job on the emulated cluster.
    ``out``: the run's folder, kept (``compare`` keeps each run under its report); by
    default a temporary one, deleted once its summary is read.
    """
    if out:
        os.makedirs(out, exist_ok=True)
        return _run(flags, timeout, launcher, out)
    with tempfile.TemporaryDirectory(prefix="disttrain-bench-") as tmp:
        return _run(flags, timeout, launcher, tmp)


def _run(
    flags: dict[str, Any], timeout: float, launcher: Sequence[str], out: str
) -> dict[str, Any]:
    argv: list[str] = []
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append("--no-" + name.replace("_", "-"))
        else:
            argv += [flag, str(value)]
    return train_argv(argv, out, timeout, launcher)


def train_argv(
    argv: Sequence[str], out: str, timeout: float = 1800, launcher: Sequence[str] = ()
) -> dict[str, Any]:
    """``[*launcher] disttrain train --no-progress *argv --out out``: its summary.json, with
    metrics.jsonl's lines under ``"metrics"``; :class:`RunFailed` names the failed command
    and its last line of stderr."""
    cmd = [sys.executable, "-m", "disttrain", "train", "--no-progress", *argv, "--out", out]
    path = os.environ.get("PYTHONPATH", "")
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": f"{SRC}{os.pathsep}{path}" if path else SRC,
    }
    result = subprocess.run(
        [*launcher, *cmd], capture_output=True, text=True, timeout=timeout, env=env
    )
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise RunFailed(f"train {' '.join(argv)}: {tail}")
    with open(os.path.join(out, "summary.json")) as fh:
        summary: dict[str, Any] = json.load(fh)
    with open(os.path.join(out, "metrics.jsonl")) as fh:
        summary["metrics"] = [json.loads(line) for line in fh if line.strip()]
    return summary
