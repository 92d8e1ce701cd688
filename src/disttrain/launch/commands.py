"""Start ``disttrain`` commands as child processes: the one home for it outside the launchers.

Benchmarks, ``compare`` and the lab start commands only through here (and the launchers in
this package and :mod:`disttrain.cluster`): :func:`start` (a Popen the caller watches and
signals) and :func:`run` (waited for) run ``python -m disttrain ARGS`` on this very package
(its folder leads PYTHONPATH, whatever the caller's working directory); :func:`train_run`
and :func:`train_argv` run a training and return its summary.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from disttrain.launch import tether

__all__ = ["RunFailed", "argv", "environment", "run", "start", "train_argv", "train_run"]

#: the folder holding the ``disttrain`` package that runs this module: its commands use it too
SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class RunFailed(RuntimeError):
    """A training run a benchmark started exited non-zero."""


def argv(args: Sequence[str]) -> list[str]:
    """``python -m disttrain ARGS`` with this interpreter."""
    return [sys.executable, "-m", "disttrain", *args]


def environment() -> dict[str, str]:
    """This process's environment with this package's folder first on PYTHONPATH, and this
    process named as the command's starter: the command ends when this process dies,
    however (:func:`disttrain.launch.tether.tie_to_starter`; start commands from the thread
    that lives as long as they should: the kernel's signal follows the starting thread)."""
    path = os.environ.get("PYTHONPATH", "")
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": f"{SRC}{os.pathsep}{path}" if path else SRC,
        tether.STARTER_ENV: str(os.getpid()),
    }


def start(args: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """``disttrain ARGS`` started (``popen``: Popen's keywords, e.g. ``stdout``)."""
    return subprocess.Popen(argv(args), env=environment(), **popen)


def run(
    args: Sequence[str], timeout: float, launcher: Sequence[str] = (), **kw: Any
) -> subprocess.CompletedProcess[Any]:
    """``[*launcher] disttrain ARGS`` waited for (``kw``: subprocess.run's keywords)."""
    return subprocess.run([*launcher, *argv(args)], env=environment(), timeout=timeout, **kw)


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
    given: list[str] = []
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            given.append(flag)
        elif value is False:
            given.append("--no-" + name.replace("_", "-"))
        else:
            given += [flag, str(value)]
    return train_argv(given, out, timeout, launcher)


def train_argv(
    flags: Sequence[str], out: str, timeout: float = 1800, launcher: Sequence[str] = ()
) -> dict[str, Any]:
    """``[*launcher] disttrain train --no-progress *flags --out out``: its summary.json, with
    metrics.jsonl's lines under ``"metrics"``; :class:`RunFailed` names the failed command
    and its last line of stderr."""
    args = ["train", "--no-progress", *flags, "--out", out]
    result = run(args, timeout, launcher, capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise RunFailed(f"train {' '.join(flags)}: {tail}")
    with open(os.path.join(out, "summary.json")) as fh:
        summary: dict[str, Any] = json.load(fh)
    with open(os.path.join(out, "metrics.jsonl")) as fh:
        summary["metrics"] = [json.loads(line) for line in fh if line.strip()]
    return summary
