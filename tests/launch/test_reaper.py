"""The watchdog ends a killed launcher's whole tree: also processes it did not start itself
and that left its process group (as a local Ray's raylet starts its agents).

The launcher here starts a child that starts a grandchild in a session of its own; the
launcher is SIGKILLed (its pid, or its process group, which leaves the grandchild and
the watchdog out); within 5 s nothing of the tree is left, the watchdog included.
Without the watchdog the grandchild would run on (the control case).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from disttrain.launch import reaper
from tests.netcheck import Proc, alive, descendants, kill

REPO = Path(__file__).resolve().parents[2]
GRANDCHILD = (
    "import subprocess, sys, time\n"
    "p = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
    "print(p.pid, flush=True)\n"
    "time.sleep(300)\n"
)
LAUNCHER = (
    "import subprocess, sys, time\n"
    "from disttrain.launch import reaper\n"
    "if sys.argv[1] == 'unrecorded':\n"
    "    reaper.INTERVAL = 600  # no record before the launcher dies: only its tag\n"
    "if sys.argv[1] in ('watched', 'unrecorded'):\n"
    "    print(reaper.watch(), flush=True)\n"
    "else:\n"
    "    print(0, flush=True)\n"
    "child = subprocess.Popen([sys.executable, '-c', sys.argv[2]], stdout=subprocess.PIPE,\n"
    "                         text=True)\n"
    "print(child.pid, child.stdout.readline().strip(), flush=True)\n"
    "time.sleep(300)\n"
)


def _tree(how: str) -> tuple[subprocess.Popen[str], list[Proc]]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, how, GRANDCHILD],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    watchdog = int(proc.stdout.readline())
    child, grandchild = (int(x) for x in proc.stdout.readline().split())
    tree = [p for p in descendants(proc.pid) if p in (child, grandchild, watchdog)]
    time.sleep(3 * reaper.INTERVAL)  # the watchdog has recorded the tree
    return proc, tree


def _gone_within(tree: list[Proc], seconds: float) -> list[Proc]:
    deadline = time.monotonic() + seconds
    while [p for p in tree if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in tree if alive(p)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["pid", "group", "unrecorded"])
def test_a_killed_launcher_s_whole_tree_ends_within_5_s(how: str) -> None:
    """``unrecorded``: the launcher dies before the watchdog's first record (a process
    started within an interval of its death); its tree still ends, found by its tag."""
    proc, tree = _tree("unrecorded" if how == "unrecorded" else "watched")
    try:
        assert len(tree) == 3, tree  # the watchdog, the child, the grandchild
        if how in ("pid", "unrecorded"):
            os.kill(proc.pid, signal.SIGKILL)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        left = _gone_within(tree, 5)
        assert not left, f"alive 5 s after the launcher's SIGKILL ({how}): {left}"
    finally:
        for p in tree:
            kill(p)
        proc.wait()


@pytest.mark.timeout(60)
def test_without_the_watchdog_the_grandchild_runs_on() -> None:
    """The control: what the watchdog is for (a killed launcher's other group)."""
    proc, tree = _tree("bare")
    try:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        left = _gone_within(tree, 2)
        assert len(left) == 1, left  # the grandchild, in its own session
    finally:
        for p in tree:
            kill(p)
        proc.wait()
