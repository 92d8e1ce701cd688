"""bench cluster-allreduce: ranks on emulated hosts, hierarchical over unequal hosts (3 + 1).

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
from tests import zygote

HAVE_NETNS = os.geteuid() == 0 and all(shutil.which(t) for t in ("ip", "tc", "unshare"))


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--ranks-per-host", "2,2,2"], "--ranks-per-host"),
        (["--ranks-per-host", "0"], "--ranks-per-host"),
        (["--ranks-per-host", "two"], "--ranks-per-host"),
        (["--workers", "4"], "--workers"),
        # bench allreduce's own table for auto is one host's: across hosts, give one
        (["--algorithms", "auto,ring"], "--allreduce-table"),
    ],  # --hosts x --ranks-per-host: not read, refused
)
def test_a_layout_that_does_not_fit_the_hosts_is_one_line_and_exit_2(
    flags: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = cli.main(["bench", "cluster-allreduce", "--hosts", "2", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and named in err[0]


@pytest.mark.skipif(not HAVE_NETNS, reason="needs root, iproute2 and unshare")
@pytest.mark.timeout(240)
def test_hierarchical_on_a_host_of_three_and_a_host_of_one(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    proc = zygote.run(
        [
            sys.executable,
            "-m",
            "disttrain",
            "bench",
            "cluster-allreduce",
            "--ranks-per-host",
            "3,1",
            "--rate",
            "1gbit",
            "--sizes",
            "4KB,1MB",
            "--algorithms",
            "hierarchical",
            "--iters",
            "1",
            "--warmup",
            "0",
            "--no-progress",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["ranks_per_host"] == [3, 1]
    rows = [r for r in got["rows"] if r["algorithm"] == "hierarchical"]
    assert [r["size"] for r in rows] == [4096, 1 << 20]
    for r in rows:  # every call's sum was checked on every rank (a wrong one exits 1)
        assert r["workers"] == 4
        # only host 0's leader crosses the network with the whole tensor; host 0's three
        # ranks meet through shared memory: the meter counts what the layout states
        assert r["bytes_sent_measured"] == r["bytes_sent_theory"] == r["size"]
        assert r["bytes_copied_measured"] == r["bytes_copied_theory"] > 0
