"""`disttrain bench allreduce`: flags checked before anything starts, rows complete and metered."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from disttrain.comm.errors import UsageError
from disttrain.lab.bench.allreduce import parse_size
from tests import zygote


def _bench(*flags: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "disttrain", "bench", "allreduce", "--no-progress", *flags]
    return zygote.run(cmd, capture_output=True, text=True, timeout=120)


def test_parse_size_uses_binary_units() -> None:
    assert [parse_size(s) for s in ("4KB", "1mb", "16MB", "100", "2B")] == [
        4096,
        1 << 20,
        16 << 20,
        100,
        2,
    ]
    with pytest.raises(UsageError):
        parse_size("lots")


@pytest.mark.parametrize(
    "flags",
    [
        ("--sizes", "4XB"),
        ("--algorithms", "ring,nope"),
        ("--workers", "0"),
        ("--iters", "0"),
        ("--json", "/no/such/folder/x.json"),
        ("--algorithms", "shm", "--allreduce-table", "*:ring"),  # nothing reads the table
    ],
)
def test_bad_flags_are_one_line_and_exit_2(flags: tuple[str, ...]) -> None:
    done = _bench(*flags)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_rows_hold_times_bandwidths_bytes_and_ratios(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "rows.json")
    done = _bench(
        "--workers",
        "2",
        "--sizes",
        "1KB,3000",
        "--algorithms",
        "ring,star",
        "--iters",
        "3",
        "--warmup",
        "1",
        "--json",
        path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    with open(path) as fh:
        rows = json.load(fh)["rows"]
    assert [(r["algorithm"], r["size"]) for r in rows] == [
        (a, s) for s in (1024, 3000) for a in ("native", "ring", "star")
    ]
    for r in rows:
        assert r["iters"] == 3 and r["time_p10_s"] <= r["time_median_s"] <= r["time_p90_s"]
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"])  # 2(n-1)/n = 1 for n=2
        assert r["bytes_sent_measured"] == r["bytes_sent_theory"]
        assert r["messages_measured"] == r["messages_theory"]
        if r["algorithm"] == "native":
            assert r["busbw_vs_native"] == pytest.approx(1.0)
    assert "busbw / native" in done.stdout
