"""Horovod's own examples, unchanged but for the import line, run by ``disttrain run -np 2``
on CPU with an offline torchvision stand-in (standins/) on PYTHONPATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
SRC = HERE.parents[1] / "src"


def _run(tmp_path: Path, script: str, *flags: str) -> str:
    env = {
        **os.environ,
        "HOME": str(tmp_path),  # MNIST's example locks ~/.horovod_lock
        "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE / "standins")]),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "disttrain",
            "run",
            "-np",
            "2",
            sys.executable,
            str(HERE / "examples" / script),
            *flags,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def test_the_synthetic_benchmark_runs_on_two_processes(tmp_path: Path) -> None:
    out = _run(
        tmp_path,
        "pytorch_synthetic_benchmark.py",
        "--batch-size",
        "4",
        "--num-warmup-batches",
        "1",
        "--num-batches-per-iter",
        "1",
        "--num-iters",
        "2",
        "--fp16-allreduce",
    )
    assert "Number of CPUs: 2" in out  # hvd.size(), printed by rank 0 only
    assert "Total img/sec on 2 CPU(s)" in out


def test_mnist_trains_on_two_processes(tmp_path: Path) -> None:
    out = _run(
        tmp_path,
        "pytorch_mnist.py",
        "--epochs",
        "2",
        "--batch-size",
        "16",
        "--log-interval",
        "100",
        "--data-dir",
        str(tmp_path / "data"),
    )
    accuracies = [
        float(line.split("Accuracy: ")[1].rstrip("%"))
        for line in out.splitlines()
        if "Test set" in line
    ]
    assert len(accuracies) == 2  # rank 0 reports each epoch, averaged over ranks
    assert accuracies[-1] > 20.0  # learnt something: chance is 10 %


def test_disttrain_run_starts_a_bare_python_as_its_own_interpreter() -> None:
    """``disttrain run -np 2 python x.py`` from a venv that is not activated: the processes
    run the interpreter that runs disttrain (with torch), not the first python on PATH."""
    from disttrain.horovod.runner import command_of

    assert command_of(["python", "x.py", "--a"]) == [sys.executable, "x.py", "--a"]
    assert command_of(["--", "python3", "x.py"]) == [sys.executable, "x.py"]
    assert command_of(["/usr/bin/python3", "x.py"]) == ["/usr/bin/python3", "x.py"]  # as given
