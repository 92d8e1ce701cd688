"""The benchmarks that moved from benchmarks/ into `disttrain bench`: found, checked, runnable."""

from __future__ import annotations

import importlib
import json
import os
import pickle
import subprocess
import sys

import pytest

from disttrain.lab.bench import benches
from disttrain.lab.bench._variants import InRanks
from tests import zygote

MOVED = (
    "allreduce-ceiling",
    "cluster-bandwidth",
    "costmodel-validation",
    "index-coding",
    "p2p-posting",
    "pipeline-recv-ahead",
    "ps",
    "ring-segments",
    "roundrobin-depth",
    "talking-less",
    "timeline-overhead",
    "training",
)

_calls: list[str] = []


def _record(tag: str) -> None:
    _calls.append(tag)


def _bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "disttrain", "bench", *args]
    return zygote.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("name", MOVED)
def test_each_is_a_sub_command_with_a_one_line_help(name: str) -> None:
    module = importlib.import_module(benches()[name])
    assert callable(module.add_arguments) and callable(module.run)
    assert (module.__doc__ or "").strip().splitlines()[0]


def test_in_ranks_calls_its_function_here_and_again_where_unpickled() -> None:
    _calls.clear()
    made = InRanks(_record, "x")
    assert _calls == ["x"]
    pickle.loads(pickle.dumps(made))
    assert _calls == ["x", "x"]


@pytest.mark.parametrize(
    "args",
    [
        ("ring-segments", "--segments", "1XB"),
        ("pipeline-recv-ahead", "1f1b", "0", "1"),
        ("pipeline-recv-ahead", "zigzag", "4", "1"),
        ("talking-less", "--only", "no such row"),
        ("allreduce-ceiling", "--repeats", "0"),
        ("training", "algorithm", "--workers", "1,x"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...]) -> None:
    done = _bench(*args)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_variants_are_not_registered_for_other_benches() -> None:
    # importing every module to list them must not add their variants to --algorithms all
    done = _bench("allreduce", "--algorithms", "nope")
    assert done.returncode == 2
    assert "roundrobin" in done.stderr
    assert "ring_seg" not in done.stderr and "roundrobin_depth1" not in done.stderr


def test_ring_segments_rows_metered_as_their_cost(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "rows.json")
    done = _bench(
        "ring-segments",
        "--workers",
        "2",
        "--sizes",
        "4KB",
        "--segments",
        "1KB",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--no-progress",
        "--json",
        path,
    )
    assert done.returncode == 0, done.stderr
    with open(path) as fh:
        rows = {r["algorithm"]: r for r in json.load(fh)["rows"]}
    assert list(rows) == ["native", "ring_seg_1KB", "ring_seg_none"]
    # 2 ranks, 4 KB: each rank sends one 2 KB chunk per phase; 1 KB segments make 2 each
    assert rows["ring_seg_1KB"]["messages_measured"] == rows["ring_seg_1KB"]["messages_theory"] == 4
    assert (
        rows["ring_seg_none"]["messages_measured"] == rows["ring_seg_none"]["messages_theory"] == 2
    )
    for name in ("ring_seg_1KB", "ring_seg_none"):
        assert rows[name]["bytes_sent_measured"] == rows[name]["bytes_sent_theory"] == 4096


def test_roundrobin_depth_runs_its_variants_in_the_ranks(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "rows.json")
    done = _bench(
        "roundrobin-depth",
        "--workers",
        "3",
        "--sizes",
        "4KB",
        "--iters",
        "1",
        "--warmup",
        "0",
        "--no-progress",
        "--json",
        path,
    )
    assert done.returncode == 0, done.stderr
    with open(path) as fh:
        rows = json.load(fh)["rows"]
    assert [r["algorithm"] for r in rows] == [
        "native",
        "roundrobin_depth1",
        "roundrobin",
        "roundrobin_all",
    ]
    # the depth changes when rounds are posted, not what is sent
    sent = {(r["bytes_sent_measured"], r["messages_measured"]) for r in rows[1:]}
    assert len(sent) == 1


@pytest.mark.timeout(180)
def test_training_algorithm_runs_a_pair_and_prints_its_ratio() -> None:
    # README's `disttrain bench training algorithm`, at its smallest: one pair at 2 workers
    done = _bench("training", "algorithm", "--workers", "2", "--repeats", "1", timeout=170)
    assert done.returncode == 0, done.stderr[-2000:]
    row = next(line for line in done.stdout.splitlines() if line.startswith("| 2 |"))
    _, table, pairs, median = [c.strip() for c in row.strip("|").split("|")]
    assert table.startswith("`") and table.endswith("`") and ":" in table  # what auto ran
    assert float(pairs) > 0 and median == f"**{pairs}**"  # one pair: its own median
