"""Run `disttrain train` from benchmarks: in a subprocess, returning its summary.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["RunFailed", "RunResult", "train_run"]


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
    argv = [sys.executable, "-m", "disttrain", "train", "--no-progress"]
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append("--no-" + name.replace("_", "-"))
        else:
            argv += [flag, str(value)]
    result = subprocess.run(
        [*launcher, *argv, "--out", out], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise RunFailed(f"{' '.join(argv[3:])}: {tail}")
    with open(os.path.join(out, "summary.json")) as fh:
        summary: dict[str, Any] = json.load(fh)
    with open(os.path.join(out, "metrics.jsonl")) as fh:
        summary["metrics"] = [json.loads(line) for line in fh]
    return summary
