"""A worker's way from ``disttrain train`` to ``loss.backward()`` (issue 49: at most 7 calls).

The count is read where it happens: the run's own loss (``--loss`` names :func:`loss`
below) hooks its gradient, and the hook, run inside ``loss.backward()`` on rank 0, writes
the stack. The worker's calls are disttrain's frames after the interpreter's start (the
last ``runpy`` frame: a forked worker's stack still holds its launcher's frames above
it), module bodies left out, up to the call of ``backward``.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import torch
from torch.nn import functional as F

from tests import zygote

REPO = Path(__file__).resolve().parents[2]
STACK_ENV = "DISTTRAIN_TEST_STACK"
PACKAGE = f"{os.sep}disttrain{os.sep}"


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy, whose gradient hook writes the stack once (rank 0's first step)."""
    value = F.cross_entropy(output, target)
    path = os.environ.get(STACK_ENV)
    if path and os.environ.get("RANK") == "0" and not os.path.exists(path):
        value.register_hook(lambda grad: _write_stack(path))
    return value


def _write_stack(path: str) -> None:
    with open(path, "w") as fh:
        fh.writelines(f"{f.filename}\t{f.name}\n" for f in traceback.extract_stack())


def worker_calls(frames: list[tuple[str, str]]) -> list[str]:
    """disttrain's function frames after the last ``runpy`` one, up to ``backward``'s."""
    start = max(i for i, (file, _) in enumerate(frames) if "runpy" in file) + 1
    calls: list[str] = []
    for file, name in frames[start:]:
        if file.endswith(f"torch{os.sep}_tensor.py") and name == "backward":
            return calls
        if PACKAGE in file and name != "<module>":
            calls.append(f"{Path(file).stem}.{name}")
    raise AssertionError(f"no loss.backward() on the stack: {frames}")


def test_a_worker_reaches_loss_backward_in_at_most_7_calls(tmp_path: Path) -> None:
    stack = tmp_path / "stack.txt"
    env = {**os.environ, STACK_ENV: str(stack)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO)])
    cmd = [sys.executable, "-m", "disttrain", "train", "--workers", "2", "--max-steps", "1"]
    cmd += [
        "--loss",
        "tests.launch.test_worker:loss",
        "--no-progress",
        "--out",
        str(tmp_path / "o"),
    ]
    done = zygote.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    frames = [tuple(line.split("\t")) for line in stack.read_text().splitlines()]
    calls = worker_calls([(file, name) for file, name in frames])
    # run_worker, train, loop, _epoch, Engine.step, StepRunner.run, forward_backward
    assert calls[0] == "worker.run_worker" and calls[-1] == "base.forward_backward", calls
    assert len(calls) <= 7, calls


def test_the_count_starts_after_the_interpreter_and_skips_module_bodies() -> None:
    frames = [
        ("/x/disttrain/cli.py", "console"),  # a launcher's frame, above the fork
        ("<frozen runpy>", "_run_code"),
        ("/x/disttrain/__main__.py", "<module>"),
        ("/x/disttrain/launch/worker.py", "run_worker"),
        ("/x/torch/nn/modules/module.py", "_call_impl"),
        ("/x/disttrain/strategies/base.py", "forward_backward"),
        (f"/x/torch{os.sep}_tensor.py", "backward"),
        ("/x/disttrain/late.py", "after"),
    ]
    assert worker_calls(frames) == ["worker.run_worker", "base.forward_backward"]
