"""A killed launcher takes its workers with it: SIGKILL of its pid or of its group.

The job trains (a step logged) when its launcher is killed; every process of its tree
recorded before the kill must be gone within 5 s (so none holds a port).
Forked workers (the CPU default) and exec'd ones (``--threads 2``) alike, and a
parameter server's ranks; Horovod's launcher (``disttrain run``); and the two other
moments of a job: workers starting, and a checkpoint being written (no shared-memory
segment of the job left either). The job folder a SIGKILLed launcher cannot remove is
swept by the next launch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from disttrain.launch import jobdir
from tests.netcheck import Proc, alive, descendants, started

REPO = Path(__file__).resolve().parents[2]
RUNS = {
    "forked": ("--max-steps", "100000"),
    "exec": ("--max-steps", "100000", "--threads", "2"),
    "ps": ("--strategy", "ps", "--ps-mode", "sync", "--max-steps", "100000"),
}


def _training(out: Path, proc: subprocess.Popen[str], within: float = 120) -> None:
    deadline = time.monotonic() + within
    while not ((out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").stat().st_size):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "no step logged"
        time.sleep(0.1)


def _kill_and_check(proc: subprocess.Popen[str], tree: list[Proc], how: str) -> None:
    """SIGKILL the launcher (its pid, or its process group), then every process of
    ``tree`` must be gone within 5 s."""
    # its job folder, named for it (found while it lives: a dead owner's folder may be
    # swept by any launch, another test's included)
    folders = list(Path(tempfile.gettempdir()).glob(f"disttrain-*-{proc.pid}.*"))
    assert folders, "the launcher's job folder is named for it"
    if how == "pid":
        os.kill(proc.pid, signal.SIGKILL)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 5
    while [p for p in tree if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in tree if alive(p)]
    assert not left, f"alive 5 s after the launcher's SIGKILL ({how}): {left}"
    # the folder outlives it (nothing runs to remove it); the next launch sweeps it
    jobdir.sweep()
    assert not [f for f in folders if f.exists()]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["pid", "group"])
@pytest.mark.parametrize("run", list(RUNS))
def test_workers_end_within_5_s_of_a_killed_launcher(run: str, how: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    cmd = [
        sys.executable,
        "-m",
        "disttrain",
        "train",
        "--model",
        "cnn",  # the smallest built-in: the kill needs a training job, not a big model
        *RUNS[run],
        "--no-progress",
        "--out",
        str(out),
    ]
    with started(cmd, env=env, cwd=REPO, start_new_session=True) as (proc, tree):
        _training(out, proc)
        tree[:] = [p for p in descendants(proc.pid) if p != proc.pid]
        assert len(tree) >= 2, tree
        _kill_and_check(proc, tree, how)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["pid", "group"])
def test_disttrain_run_s_processes_end_within_5_s_of_its_killed_launcher(how: str) -> None:
    """Horovod's launcher (``disttrain run -np 2 COMMAND``) ties its processes alike."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
    cmd = [sys.executable, "-m", "disttrain", "run", "-np", "2", *sleeper]
    with started(cmd, env=env, cwd=REPO, start_new_session=True) as (proc, tree):
        deadline = time.monotonic() + 60
        while len(tree) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1]
            tree[:] = [p for p in descendants(proc.pid) if p != proc.pid]
            time.sleep(0.1)
        assert len(tree) == 2, tree
        _kill_and_check(proc, tree, how)


def _starting(out: Path, proc: subprocess.Popen[str]) -> bool:
    """Workers exist, none has logged a step yet."""
    return len(descendants(proc.pid)) >= 3 and not (out / "metrics.jsonl").exists()


def _checkpointing(out: Path, proc: subprocess.Popen[str]) -> bool:
    """A step's checkpoint is being written: its staging folder exists (not yet renamed)."""
    folder = out / "checkpoints"
    return folder.is_dir() and any(p.name.startswith(".step-") for p in folder.iterdir())


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("when", "ready"), [("start-up", _starting), ("checkpoint", _checkpointing)]
)
def test_a_launcher_killed_at_start_up_or_mid_checkpoint_leaves_nothing(
    when: str, ready: object, tmp_path: Path
) -> None:
    """The same kill at the two other moments of a job: workers starting (before any step)
    and a checkpoint being written (every step writes one). Nothing of the job is left:
    no process, and no shared-memory segment of its tag."""
    from tests.train.test_faults import _shm

    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    flags = ["--max-steps", "100000", "--checkpoint-every", "1", "--algorithm", "shm"]
    cmd = [sys.executable, "-m", "disttrain", "train", *flags, "--no-progress", "--out", str(out)]
    shm_before = _shm()
    with started(cmd, env=env, cwd=REPO) as (proc, tree):
        deadline = time.monotonic() + 120
        assert callable(ready)
        while not ready(out, proc):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
            time.sleep(0.02)
        tree[:] = [p for p in descendants(proc.pid) if p != proc.pid]
        assert tree, f"no process of the job found at {when}"
        _kill_and_check(proc, tree, "pid")
        tag = f"disttrain-shm-j{proc.pid}x"
        assert not [n for n in _shm() - shm_before if n.startswith(tag)]
