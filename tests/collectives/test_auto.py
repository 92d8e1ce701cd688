"""``--algorithm auto``: the table (its grammar, its lookup), the cost model's choice of it,
and a run whose launcher chooses it: every call ran by the table's algorithm for its size,
the sum torch's, and summary.json saying what ran each size."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from disttrain import calibration, collectives, costing
from disttrain.collectives.auto import Auto, AutoConfig, parse_table
from disttrain.comm.errors import UsageError
from tests import zygote
from tests.harness import run_world

REPO = Path(__file__).resolve().parents[2]


def test_a_table_maps_each_size_to_the_first_bound_that_holds_it() -> None:
    auto = Auto(AutoConfig("4096:tree,65536:ring,*:shm"))
    assert [auto.name_for(n) for n in (1, 4096, 4097, 65536, 10**9)] == [
        "tree",
        "tree",
        "ring",
        "ring",
        "shm",
    ]
    # what a call sends is what its algorithm sends
    assert auto.cost(4096, 4, 1, 4) == collectives.get("tree").cost(4096, 4, 1, 4)
    assert auto.cost(10**6, 4, 1, 4, "all_gather") == collectives.get("shm").cost(
        10**6, 4, 1, 4, "all_gather"
    )


def test_without_a_table_every_size_is_the_backends_own() -> None:
    auto = Auto()
    assert auto.table == [(float("inf"), "native")] and not auto.given


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("4096:ring", "end with *:ALGORITHM"),
        ("4096:gossip,*:ring", "'gossip' is not an algorithm to run"),
        ("4096:auto,*:ring", "'auto' is not an algorithm to run"),
        ("4KB:tree,*:ring", "'4KB' is not a byte count"),
        ("65536:tree,4096:ring,*:shm", "sizes must increase"),
        ("ring", "write SIZE:ALGORITHM"),
    ],
)
def test_a_bad_table_is_one_line_naming_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(UsageError, match=re.escape(f"--allreduce-table '{text}'")) as info:
        parse_table(text)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_the_cost_model_picks_the_fastest_candidate_at_each_size() -> None:
    cal = calibration.reference()
    table = costing.allreduce_table(3, 1, cal)
    auto = Auto(AutoConfig(table))  # a valid table, ending in *
    a, d, b = cal.loopback_link(3)
    net = costing.Network(alpha=a, beta=b, delta=d, shared_host=True)
    names = costing.auto_candidates(shared_host=True)
    assert "shm" in names and names[0] == "native" and "hierarchical" not in names
    for size in costing.TABLE_SIZES:
        times = {n: costing.allreduce_seconds(n, size, 3, net, cal)[0] for n in names}
        assert times[auto.name_for(size)] == min(times.values()), size
    # across hosts: hierarchical where hosts hold several ranks; one rank: nothing to send
    assert costing.allreduce_table(4, 2, cal) == "*:hierarchical"
    assert costing.allreduce_table(1, 1, cal) == "*:native"
    assert "shm" not in costing.allreduce_table(4, 4, cal)  # one rank a host: no shared memory


def _sums(table: str) -> tuple[bool, dict[int, str]]:
    import torch.distributed as dist

    auto = collectives.build("auto", _Config(table))
    me = dist.get_rank()
    ok = True
    for numel in (10, 5000):  # 40 B and 20 KB: one each side of the table's bound
        x = torch.randn(numel, generator=torch.Generator().manual_seed(me + numel))
        expected = x.clone()
        dist.all_reduce(expected)
        auto.all_reduce(x)
        ok = ok and torch.allclose(x, expected, atol=1e-5)
    return ok, dict(auto.chosen)


class _Config:
    def __init__(self, table: str) -> None:
        self.table = table

    def get(self, name: str) -> str:
        assert name == "allreduce_table"
        return self.table


@pytest.mark.timeout(90)
def test_each_call_runs_the_tables_algorithm_for_its_size_and_sums_as_torch() -> None:
    for ok, chosen in run_world(_sums, 3, args=("4096:tree,*:ring",), timeout=60):
        assert ok
        assert chosen == {40: "tree", 20000: "ring"}


def _reducer(algorithm: str) -> tuple[bool, int, dict[int, str]]:
    from disttrain.comm.meter import meter
    from disttrain.dataparallel.reducer import Reducer

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    algo = (
        collectives.build("auto", _Config(algorithm[5:])) if algorithm[:5] == "auto:" else algorithm
    )
    reducer = Reducer(list(model.parameters()), algorithm=algo, fusion_mb=0)
    meter.reset()
    model(torch.ones(2, 8)).sum().backward()
    reducer.synchronize()
    threaded, sent = reducer._thread is not None, meter.bytes_sent
    reducer.close()
    return threaded, sent, reducer.stats().get("allreduce_by_size", {})


@pytest.mark.timeout(120)
def test_a_table_of_native_alone_runs_on_the_backends_threads_as_native_does() -> None:
    # auto's '*:native' (cuda, live membership, one rank a host) takes native's own path:
    # no communication thread, the same metered bytes; '*:shm' needs the thread
    runs = {
        a: run_world(_reducer, 2, args=(a,), timeout=90)[0]
        for a in ("native", "auto:*:native", "auto:*:shm")
    }
    assert runs["native"][:2] == (False, runs["auto:*:native"][1]) and runs["native"][1] > 0
    assert runs["auto:*:native"][0] is False
    assert runs["auto:*:native"][2] == {16: "native", 128: "native"}
    assert runs["auto:*:shm"][0] is True and set(runs["auto:*:shm"][2].values()) == {"shm"}


@pytest.mark.timeout(120)
def test_the_launcher_chooses_the_table_and_the_summary_says_what_ran(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "XDG_CACHE_HOME": str(tmp_path)}
    flags = ["--workers", "2", "--max-steps", "3", "--epochs", "1", "--out", str(out)]
    done = subprocess.run(  # the allreduce strategy's default: --algorithm auto
        [sys.executable, "-m", "disttrain", "train", *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algorithm"] == "auto"
    table = summary["config"]["allreduce_table"]
    # no calibration of this machine (a fresh cache folder): the reference's, said so
    assert table == costing.allreduce_table(2, 1, calibration.reference())
    assert f"--algorithm auto: {table} (the cost model, the reference machine's" in done.stderr
    auto = Auto(AutoConfig(table))
    ran = summary["data_parallel"]["allreduce_by_size"]
    assert ran and all(auto.name_for(int(size)) == name for size, name in ran.items())
    assert {int(s) for s in ran} == set(summary["data_parallel"]["bucket_bytes"])
    assert "allreduce by size" in done.stdout


@pytest.mark.parametrize(
    "flags",
    [
        {"workers": 3, "min_workers": 2},
        {"workers": 2, "max_workers": 3},
        {"device": "cuda"},
        {"workers": 1, "nnodes": 4, "rdzv_endpoint": "10.0.0.1:29400"},
    ],
    ids=["shrink", "grow", "cuda", "one rank a host"],
)
def test_the_backends_own_where_the_model_does_not_choose(
    flags: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    # live membership (one table for one world; the backend's group is re-formed), cuda, and
    # one rank a host (no constants of the network: the reference's are a loopback)
    from disttrain import config, strategies  # noqa: F401  (the strategies' defaults)
    from disttrain.launch import autotable

    cfg = config.load(flags)
    assert cfg.train.algorithm == "auto"  # the allreduce strategy's default
    chosen, argv = autotable.choose(cfg, ["train"])
    assert argv == ["train", "--allreduce-table", "*:native"]
    assert chosen.section(AutoConfig).allreduce_table == "*:native"
    assert "--algorithm auto: *:native (" in capsys.readouterr().err


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("strategy", "where"), [("zero", "zero"), ("localsgd", "")])
def test_zero_and_the_averaging_strategies_say_what_ran_each_size(
    strategy: str, where: str, tmp_path: Path
) -> None:
    # auto is their default too; diloco's summary is localsgd's (its subclass)
    out = tmp_path / "run"
    flags = ["--strategy", strategy, "--max-steps", "2", "--epochs", "1", "--out", str(out)]
    done = zygote.run(  # forked from the test's zygote: no second torch import
        [sys.executable, "-m", "disttrain", "train", "--no-progress", *flags],
        env={**os.environ, "PYTHONPATH": str(REPO / "src"), "XDG_CACHE_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    ran = (summary[where] if where else summary)["allreduce_by_size"]
    auto = Auto(AutoConfig(summary["config"]["allreduce_table"]))
    assert ran and all(auto.name_for(int(size)) == name for size, name in ran.items())
