"""A user's script killed mid-epoch (``kill -9`` of a worker, by --inject-fault), then
resumed from its saved ``run.state_dict()`` on another worker count: every sample of
each epoch is trained exactly once across the two runs (examples/resumable_loop.py,
started by ``disttrain run -np 2`` and resumed by ``torchrun --nproc-per-node 4``); and
the same of a stream with a state (``--stream``, 2 loader workers a worker), resumed on
1 worker (``torchrun --nproc-per-node 1``), whose epoch's rest is re-cut.

A sample counts as trained when the step that trained it is in the state the resumed
run loaded: a step the killed job trained after its last save is trained again, as with
any checkpoint."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests import zygote
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SCRIPT = str(REPO / "examples" / "resumable_loop.py")


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}",
    }


def _trained(out: Path) -> list[tuple[int, int, int]]:
    lines = [
        ln.split() for f in sorted(out.glob("trained-*.txt")) for ln in f.read_text().splitlines()
    ]
    return [(int(e), int(s), int(i)) for e, s, i in lines]


def _killed_then_resumed(
    out: Path, resumed_on: int, flags: tuple[str, ...] = (), then: tuple[str, ...] = ()
) -> None:
    """The script (``flags``) killed at its step 5 on 2 workers, resumed on
    ``resumed_on`` (``then``): every sample of each epoch trained exactly once across the
    two runs."""
    # ``disttrain run`` as ``python -m disttrain run``, forked from the test's zygote (the
    # command as it runs, less the launcher's torch import); its workers exec the script
    first = zygote.run(
        [sys.executable, "-m", "disttrain", "run", "-np", "2", sys.executable, SCRIPT,
         "--out", str(out), "--inject-fault", "kill:rank=1:step=5", *flags],
        capture_output=True, text=True, timeout=120, env=_env(), cwd=out,
    )  # fmt: skip
    assert first.returncode != 0, "the killed job must fail"
    saved = torch.load(out / "state.pt", weights_only=True)["steps"]
    assert 1 <= saved < 12, saved  # a mid-epoch state (12 steps an epoch)
    before = [t for t in _trained(out) if t[1] <= saved]  # the committed steps
    for f in out.glob("trained-*.txt"):
        f.unlink()
    second = subprocess.run(
        [str(BIN / "torchrun"), "--nproc-per-node", str(resumed_on), "--master-addr",
         "127.0.0.1", "--master-port", str(free_port()), SCRIPT, "--out", str(out), *then],
        capture_output=True, text=True, timeout=120, env=_env(), cwd=out,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr[-3000:]
    assert "starts again" not in second.stderr, second.stderr[-3000:]
    after = _trained(out)
    assert min(s for _, s, _ in after) == saved + 1  # it went on from the saved step
    counts = collections.Counter((e, i) for e, _, i in before + after)
    assert set(counts) == {(e, i) for e in range(2) for i in range(96)}, "a sample never trained"
    assert set(counts.values()) == {1}, "a sample trained twice in one epoch"


@pytest.mark.timeout(240)
def test_killed_then_resumed_on_four_workers_trains_each_sample_once(tmp_path: Path) -> None:
    _killed_then_resumed(tmp_path, 4)


@pytest.mark.timeout(240)
def test_a_killed_stream_resumed_on_another_layout_trains_each_sample_once(
    tmp_path: Path,
) -> None:
    """A stream with a state, 2 loader workers on each of 2 workers, killed mid-epoch,
    resumed on 1 worker of 3 loader workers: the rest of the epoch is re-cut."""
    _killed_then_resumed(
        tmp_path, 1, ("--stream", "--loader-workers", "2"), ("--stream", "--loader-workers", "3")
    )
