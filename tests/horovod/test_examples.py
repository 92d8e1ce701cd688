"""Horovod's own examples, unchanged but for the import line, run by ``disttrain run -np 2``
on CPU with an offline torchvision stand-in (standins/) on PYTHONPATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

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


def _image_folder(root: Path, classes: int, per_class: int, seed: int) -> str:
    """``root/<class>/<n>.png``: small RGB images whose colour tells their class."""
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True)
        for n in range(per_class):
            pixels = torch.randint(0, 80, (24, 32, 3), generator=g, dtype=torch.uint8)
            pixels[..., c % 3] += 150
            Image.fromarray(pixels.numpy()).save(root / f"c{c}" / f"{n}.png")
    return str(root)


def test_imagenet_example_trains_checkpoints_and_resumes_on_two_processes(
    tmp_path: Path,
) -> None:
    train = _image_folder(tmp_path / "train", classes=2, per_class=8, seed=0)
    val = _image_folder(tmp_path / "val", classes=2, per_class=4, seed=1)
    data = ["--train-dir", train, "--val-dir", val, "--batch-size", "4"]
    # one epoch of 2 steps of 2 sub-batches each (backward_passes_per_step=2), fp16 wire
    first = _run(
        tmp_path,
        "pytorch_imagenet_resnet50.py",
        *data,
        "--epochs",
        "1",
        "--batches-per-allreduce",
        "2",
        "--fp16-allreduce",
        "--val-batch-size",
        "2",
    )
    assert "Train Epoch     #1: 1/1" in first and "Validate Epoch  #1: 2/2" in first
    assert (tmp_path / "checkpoint-1.pth.tar").exists()  # rank 0's, for the resume below
    assert any((tmp_path / "logs").iterdir())  # rank 0's TensorBoard events
    # a second run resumes from checkpoint-1: rank 0 loads it, broadcasts the epoch,
    # the parameters and the optimizer's momentum; only epoch 2 runs
    again = _run(tmp_path, "pytorch_imagenet_resnet50.py", *data, "--epochs", "2")
    assert "Train Epoch     #2: 2/2" in again and "#1" not in again
    assert (tmp_path / "checkpoint-2.pth.tar").exists()


def test_elastic_synthetic_benchmark_runs_on_two_processes(tmp_path: Path) -> None:
    out = _run(
        tmp_path,
        "pytorch_synthetic_benchmark_elastic.py",
        "--batch-size",
        "4",
        "--num-warmup-batches",
        "1",
        "--num-batches-per-iter",
        "1",
        "--num-iters",
        "3",
        "--num-batches-per-commit",
        "2",
    )
    assert "Number of CPUs: 2" in out and "Running warmup..." in out
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("Iter #")] == [
        "Iter #0",
        "Iter #1",
        "Iter #2",
    ]
    assert "Total img/sec on 2 CPU(s)" in out
