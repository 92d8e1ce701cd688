"""bench cluster-time-to-loss: the trailing mean and time to target, bad input, one real run.

The run needs root and iproute2 (network namespaces) and skips elsewhere, saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from disttrain import cli
from disttrain.lab.bench.cluster_time_to_loss import mean_curve, time_to_loss
from tests import zygote

HAVE_NETNS = os.geteuid() == 0 and all(shutil.which(t) for t in ("ip", "tc", "unshare"))


def test_the_mean_is_over_full_windows_and_the_time_is_the_first_at_or_below_target() -> None:
    losses = [4.0, 3.0, 2.0, 2.0, 1.0]
    lines = [{"step": 2 * i + 2, "loss": x, "wall_seconds": 0.5 * i} for i, x in enumerate(losses)]
    lines.insert(3, {"step": 6, "test_loss": 0.1, "wall_seconds": 9.9})  # an evaluation: skipped
    curve = mean_curve(lines, 2)
    # by hand: means of (4,3), (3,2), (2,2), (2,1) at the second line of each pair
    assert curve == [(4, 0.5, 3.5), (6, 1.0, 2.5), (8, 1.5, 2.0), (10, 2.0, 1.5)]
    assert time_to_loss(curve, 2.5) == (6, 1.0)  # "at most": equal counts
    assert time_to_loss(curve, 1.4) is None


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--window", "7"], "--window"),  # not a multiple of --log-every 5
        (["--window", "500", "--max-steps", "100"], "--window"),
        (["--rates", "fast"], "fast"),
        (["--strategies", "allreduce:ring"], "--strategies"),
        (["--hosts", "1"], "--hosts"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    flags: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = cli.main(["bench", "cluster-time-to-loss", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and named in err[0]


@pytest.mark.skipif(not HAVE_NETNS, reason="needs root, iproute2 and unshare")
@pytest.mark.timeout(300)
def test_sync_and_diloco_on_two_hosts(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    proc = zygote.run(
        [
            sys.executable,
            "-m",
            "disttrain",
            "bench",
            "cluster-time-to-loss",
            "--hosts",
            "2",
            "--rates",
            "1gbit",
            "--workload",
            "digits",
            "--max-steps",
            "20",
            "--log-every",
            "2",
            "--window",
            "10",
            "--strategies",
            "allreduce:ring, diloco:period=5:algorithm=ring",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    anchor, diloco = json.loads(out.read_text())["rows"]
    assert anchor["steps"] == diloco["steps"] == 20
    # the target is the anchor's last trailing mean, which the anchor itself reaches
    assert anchor["target"] == anchor["curve"][-1][2] == diloco["target"]
    assert anchor["speedup"] == 1.0 and anchor["time_to_target"] <= anchor["train_seconds"]
    # both crossed the shaped links as stated: DiLoCo averages once every 5 steps
    assert anchor["bytes_sent_per_rank"] == 5 * diloco["bytes_sent_per_rank"]
