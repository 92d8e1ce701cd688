"""Ctrl-C or SIGTERM to ``disttrain train``: one line, the shell's exit code, nothing left.

The launcher gets the signal while its workers train (SIGINT as a terminal's Ctrl-C
sends it to the launcher; the workers run in sessions of their own). It must end with
130 (SIGINT) or 143 (SIGTERM), its last stderr line ``interrupted|terminated at step S;
last checkpoint at step C``, no traceback, and no process of the job alive.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from disttrain import checkpoint
from tests.launch.test_tether import _training
from tests.netcheck import Proc, alive, descendants, kill

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("sig", "code", "verb"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
)
def test_a_signalled_launcher_says_one_line_and_leaves_nothing(
    sig: int, code: int, verb: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    cmd = [
        sys.executable,
        "-m",
        "disttrain",
        "train",
        "--model",
        "cnn",  # the smallest built-in: the signal needs a training job, not a big model
        "--max-steps",
        "100000",
        "--checkpoint-every",
        "2",
        "--no-progress",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    tree: list[Proc] = []
    try:
        _training(out, proc)
        while checkpoint.latest(str(out)) is None:  # a step committed
            time.sleep(0.1)
        tree = [p for p in descendants(proc.pid) if p != proc.pid]
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        for p in [*descendants(proc.pid)[::-1], *tree]:
            kill(p)
        proc.wait()
    assert proc.returncode == code, err
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(rf"disttrain: {verb} at step \d+; last checkpoint at step \d+", last), err
    assert err.count(verb) == 1, err
    assert not [p for p in tree if alive(p)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("entry", ["disttrain", "python -m disttrain"])
def test_a_ctrl_c_in_the_first_second_is_one_line_too(entry: str, tmp_path: Path) -> None:
    """Ctrl-C while the command imports torch (once libtorch is mapped: a second or more
    here), and 0.3 s later in pre-flight: one line, 130, no traceback. In the command,
    ``import disttrain`` loads torch only on first use, so the signal lands inside
    ``cli.main``. (The interpreter's own start, before any disttrain code, is not ours.)"""
    cmd = (
        [str(Path(sys.executable).with_name("disttrain"))]
        if entry == "disttrain"
        else [sys.executable, "-m", "disttrain"]
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    for later in (0.0, 0.3):
        proc = subprocess.Popen(
            [*cmd, "train", "--max-steps", "5", "--out", str(tmp_path)],
            env=env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_default_sigint,
        )
        _await_libtorch(proc.pid)
        time.sleep(later)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and "Traceback" not in err, (later, proc.returncode, err)
        assert err.strip().splitlines()[-1].startswith("disttrain: interrupted"), (later, err)


def _await_libtorch(pid: int) -> None:
    """Until ``pid`` maps torch's C++ library: it is importing torch."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as maps:
            if "libtorch_cpu" in maps.read():
                return
        time.sleep(0.005)
    raise AssertionError(f"pid {pid} did not load libtorch in 30 s")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job ignores it


@pytest.mark.timeout(120)
def test_a_terminal_sees_pre_flight_then_the_workers_start_then_progress(tmp_path: Path) -> None:
    """On a terminal (a pty here) the launcher says what it does before rank 0's progress
    bar takes over: pre-flight, then the workers' start (an order, not a timing)."""
    import pty

    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    cmd = [
        sys.executable,
        "-m",
        "disttrain",
        "train",
        "--max-steps",
        "3",
        "--model",
        "cnn",  # the smallest built-in: the order of the lines is the subject
        "--out",
        str(tmp_path / "out"),
    ]
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command on the pty
        os.chdir(REPO)
        os.execve(sys.executable, cmd, env)
    seen = b""
    with contextlib.suppress(OSError):  # EIO once the child has closed the pty
        while chunk := os.read(fd, 4096):
            seen += chunk
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, seen.decode(errors="replace")
    text = seen.decode(errors="replace")
    marks = [
        "disttrain: pre-flight: settings, data set, one batch of the model",
        "disttrain: starting 2 worker process(es)",
        "step ",
    ]
    where = [text.find(m) for m in marks]
    assert -1 not in where and where == sorted(where), text[:2000]
