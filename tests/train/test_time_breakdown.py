"""Every figure of ``time_breakdown`` is what its name says, for every strategy.

Rank 1 is made 4x slower (``--inject-fault slow:4``: it sleeps 3x its step after
each step), so rank 0 spends most of its step waiting for rank 1: in a
collective, a push, or a pipeline neighbour's tensor. That wait must be booked as
``communication``, not ``compute``, wherever in the step it happens (the pipeline
and tensor slicing wait inside forward/backward). Compressed runs book encoding and
decoding as ``codec``, apart from communication. In every run the parts add up to
no more than the wall time (each second is booked once).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_cli import run_cli

SLOW = ("--inject-fault", "slow:4:rank=1:step=1")
RUNS = {
    "allreduce": ("--strategy", "allreduce", "--model", "mlp"),
    "ps": ("--strategy", "ps", "--ps-mode", "sync", "--servers", "1", "--model", "mlp"),
    "localsgd": ("--strategy", "localsgd", "--period", "2", "--model", "mlp"),
    "decentralized": (
        "--strategy",
        "decentralized",
        "--compression",
        "onebit:0.01",
        "--optimizer",
        "sgd",
        "--model",
        "mlp",
    ),
    "allreduce-onebit": (
        "--strategy",
        "allreduce",
        "--compression",
        "onebit:0.01",
        "--model",
        "mlp",
    ),
    "pipeline": (
        "--strategy",
        "pipeline",
        "--schedule",
        "gpipe",
        "--microbatches",
        "4",
        "--model",
        "mlp",
    ),
    "tensor": ("--strategy", "tensor", "--model", "mlp"),
    "hybrid": ("--strategy", "hybrid", "--pp", "2", "--model", "mlp"),
}
COMPRESSED = {"decentralized", "allreduce-onebit"}


def _run(tmp: Path, flags: tuple[str, ...]) -> dict[str, object]:
    out = tmp / "out"
    done = run_cli(
        "train",
        *flags,
        "--workers",
        "2",
        "--max-steps",
        "6",
        "--no-progress",
        "--timeout",
        "60",
        *SLOW,
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    return json.loads((out / "summary.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", list(RUNS))
def test_waiting_for_a_slow_peer_is_communication(tmp_path: Path, name: str) -> None:
    summary = _run(tmp_path, RUNS[name])
    times: dict[str, float] = summary["time_breakdown"]  # type: ignore[assignment]
    assert summary["bytes_sent_per_rank"] + summary["bytes_copied_per_rank"] > 0  # type: ignore[operator]
    # rank 0 computes about as long as rank 1 and then waits ~3x that for it
    assert times["communication"] > times["compute"], times
    assert sum(times.values()) <= summary["wall_seconds"], (times, summary["wall_seconds"])
    if name in COMPRESSED:  # encoding and decoding are booked apart from communication
        assert times["codec"] > 0, times
    else:
        assert "codec" not in times, times
