"""Nothing a local job opens listens beyond the loopback address, for every strategy.

The listening sockets of the whole process tree (launcher, agent, workers, parameter
servers with their ZeroMQ sockets) are read from /proc/net/tcp and tcp6 while the
workers train. A run that names an address (``--ps-address 0.0.0.0``) shows that the
check does see a wildcard listener when there is one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from disttrain.strategies import STRATEGIES
from tests import zygote
from tests.netcheck import descendants, kill, listening_addresses

REPO = Path(__file__).resolve().parents[2]
# each test starts a whole job; on the shared 2-core machine one took up to 140 s
pytestmark = pytest.mark.timeout(360)
LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")

#: strategy -> the flags of a tiny run of it (at most 4 processes)
RUNS: dict[str, list[str]] = {
    "allreduce": [],
    "ps": ["--servers", "2"],
    "localsgd": ["--period", "2"],
    "diloco": ["--period", "2", "--fragments", "2"],  # streaming: a second process group
    "zero": ["--zero-stage", "3"],
    "decentralized": ["--topology", "ring", "--compression", "topk:0.1"],
    "pipeline": ["--microbatches", "2"],
    "tensor": [],
    "hybrid": ["--workers", "4", "--tp", "2"],
}


def _listeners(tmp_path: Path, flags: list[str]) -> set[tuple[str, int]]:
    """Every (address, port) the job's process tree listens on while it trains."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = zygote.popen(
        [
            sys.executable,
            "-m",
            "disttrain",
            "train",
            "--workers",
            "2",
            # the smallest built-in model: what listens does not depend on the model's
            # size, and the default mlp's 6.4M parameters cost ~3x the CPU of the run
            "--model",
            "cnn",
            "--epochs",
            "30",
            "--no-progress",
            "--out",
            str(tmp_path / "o"),
            *flags,
        ],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: set[tuple[str, int]] = set()
    try:
        deadline = time.monotonic() + 120
        metrics = tmp_path / "o" / "metrics.jsonl"
        # sample while the workers are training (the metrics file grows)
        while time.monotonic() < deadline and proc.poll() is None:
            seen.update(listening_addresses(descendants(proc.pid)))
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 5:
                break
            time.sleep(0.2)
        if not metrics.exists():
            proc.kill()
            pytest.fail(f"the job never started training: {proc.communicate()[1][-2000:]}")
        seen.update(listening_addresses(descendants(proc.pid)))
    finally:
        tree = descendants(proc.pid)
        proc.terminate()  # the elastic agent stops its workers on SIGTERM
        try:
            proc.wait(timeout=30)
        finally:
            for p in tree[1:]:
                kill(p)
    assert seen, "gloo always listens for its peers: no listener seen means the check is broken"
    return seen


def test_every_registered_strategy_has_a_run_here() -> None:
    assert set(RUNS) == set(STRATEGIES), "a new strategy needs a row in RUNS"


@pytest.mark.parametrize("strategy", sorted(RUNS))
def test_a_local_job_listens_only_on_loopback(tmp_path: Path, strategy: str) -> None:
    seen = _listeners(tmp_path, ["--strategy", strategy, *RUNS[strategy]])
    assert all(addr in LOOPBACK for addr, _ in seen), seen


def test_ps_with_curve_listens_only_on_loopback_and_trains(tmp_path: Path) -> None:
    from disttrain.ps.auth import write_key

    write_key(str(tmp_path / "job.key"))
    flags = ["--strategy", "ps", "--ps-curve-key", str(tmp_path / "job.key")]
    seen = _listeners(tmp_path, flags)  # reaching 5 metrics lines means the servers answered
    assert all(addr in LOOPBACK for addr, _ in seen), seen


def test_a_named_address_is_seen_by_the_check(tmp_path: Path) -> None:
    """Positive control: the user asks the servers to listen on every interface."""
    seen = _listeners(tmp_path, ["--strategy", "ps", "--ps-address", "0.0.0.0"])
    assert any(addr == "0.0.0.0" for addr, _ in seen), seen
    assert sum(addr not in LOOPBACK for addr, _ in seen) == 1, seen  # only the ps server
