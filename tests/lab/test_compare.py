"""`disttrain compare`: the spec grammar, bad input refused before any run, and a real run
(tests/lab/shared_compare.py's, shared with two other files)."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest

from disttrain.cli import main
from disttrain.comm.errors import UsageError
from disttrain.lab.report import held_bytes
from disttrain.strategies.spec import parse_one, parse_specs
from tests.lab.shared_compare import GROUP, SPECS, STEPS, TIMEOUT, compared


@pytest.mark.parametrize(
    ("text", "strategy", "settings"),
    [
        ("allreduce:ring", "allreduce", {"algorithm": "ring"}),
        ("ps:async", "ps", {"ps_mode": "async"}),
        ("localsgd:period=16", "localsgd", {"period": 16}),
        ("localsgd:8", "localsgd", {"period": 8}),
        ("decentralized:onebit", "decentralized", {"compression": "onebit:0.03"}),
        ("decentralized:onebit:0.05", "decentralized", {"compression": "onebit:0.05"}),
        (
            "decentralized:compression=topk:0.01:optimizer=sgd:lr=0.5",
            "decentralized",
            {"compression": "topk:0.01", "optimizer": "sgd", "lr": 0.5},
        ),
        (
            "ps:ssp:staleness-bound=3:straggler=1:2.5",
            "ps",
            {"ps_mode": "ssp", "staleness_bound": 3, "straggler": "1:2.5"},
        ),
        ("allreduce:overlap=false", "allreduce", {"overlap": False}),
        ("hybrid:pp=2", "hybrid", {"pp": 2}),
        ("tensor", "tensor", {}),
    ],
)
def test_spec_grammar(text: str, strategy: str, settings: dict[str, object]) -> None:
    spec = parse_one(text)
    assert (spec.label, spec.strategy, spec.settings) == (text, strategy, settings)
    assert type(spec.settings.get("lr", 0.0)) is float
    common = {"workers": 4, "lr": 0.1, "strategy": "x"}
    assert spec.flags(common) == {**common, "strategy": strategy, **settings}


def test_spec_list() -> None:
    specs = parse_specs(" allreduce:ring, ps:async ,, decentralized:onebit ")
    assert [s.label for s in specs] == ["allreduce:ring", "ps:async", "decentralized:onebit"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nope:1", "'nope': unknown strategy"),
        ("", "give at least one"),
        ("allreduce:ring, allreduce:ring", "listed twice"),
        ("localsgd:period=x", "period='x' is not a int"),
        ("allreduce:overlap=maybe", "overlap='maybe' is not a bool"),
        ("localsgd:bogus=1", "'bogus' is not a train setting"),
        ("hybrid:3", "hybrid has no main setting"),
        ("allreduce:out=/tmp", "compare sets --out itself"),
        ("localsgd:16:period=8", "period given twice"),
        ("allreduce:=3", "no name before '='"),
        ("allreduce:algorithm=", "empty value"),
    ],
)
def test_bad_spec_grammar(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        parse_specs(text)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--strategies", "nope"], "--strategies: 'nope': unknown strategy"),  # the flag typed
        (["--strategies", "localsgd:period=x"], "is not a int"),
        (["--strategies", "allreduce:nope"], "'nope': unknown allreduce algorithm"),
        (["--strategies", "localsgd:period=0"], "--period must be >= 1"),  # checked like train does
        (["--strategies", "allreduce", "--batch-size", "63"], "not divisible"),
        (["--strategies", "allreduce", "--strategy", "ps"], "--strategy cannot be given"),
        (["--strategies", "allreduce", "--target", "2"], "--target must be in (0, 1]"),
        (["--strategies", "allreduce", "--cluster", "nocl"], "cluster"),
        (["--strategies", "allreduce", "--workers", "three"], "invalid int value"),
    ],
)
def test_bad_input_exits_2_before_any_run(
    argv: list[str],
    message: str,
    tmp_path: object,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DISTTRAIN_CLUSTER_DIR", str(tmp_path))  # no cluster is up there
    out = os.path.join(str(tmp_path), "report")
    try:
        code = main(["compare", *argv, "--out", out])
    except SystemExit as exc:  # argparse's own errors (a flag's type) exit from the parser
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not os.path.exists(out)  # nothing ran, nothing written


def _row_cells(report: str, label: str) -> list[str]:
    row = next(line for line in report.splitlines() if line.startswith(f"| {label} |"))
    return [c.strip() for c in row.strip("|").split("|")]


@pytest.mark.xdist_group(GROUP)
@pytest.mark.timeout(TIMEOUT)
def test_compare_end_to_end(tmp_path_factory: pytest.TempPathFactory) -> None:
    """tests/lab/shared_compare.py's real run: every cell of the report is its run's own
    figure (the accuracy and target columns' logic: tests/lab/test_report.py)."""
    shared = compared(tmp_path_factory)
    out = str(shared.out)
    with open(os.path.join(out, "runs.json")) as fh:
        runs = json.load(fh)
    assert [r["label"] for r in runs] == SPECS
    # the terminal ends with the main table, then where the report is
    lines = shared.done.stdout.strip().splitlines()
    assert lines[-1] == f"compare: wrote {out}/report.md and {out}/report.html"
    for run in runs:
        row = next(x for x in lines if x.startswith(f"│ {run['label']} "))
        assert f"{run['summary']['samples_per_second']:.1f}" in row, shared.done.stdout
    with open(os.path.join(out, "report.md")) as fh:
        report = fh.read()
    for run in runs:
        s = run["summary"]
        assert s["steps"] == STEPS and s["strategy"] == run["flags"]["strategy"]
        assert s["config"]["seed"] == 0 and s["config"]["batch_size"] == 32  # same workload
        assert _row_cells(report, run["label"]) == [
            run["label"],
            "ok",
            "-",  # a regression has no accuracy
            f"{s['final_test_loss']:.4f}",
            f"{s['wall_seconds']:.1f}",
            f"{s['samples_per_second']:.1f}",
            f"{s['bytes_sent_per_rank']:,.0f}",
            f"{s['bytes_copied_per_rank']:,.0f}",  # localsgd's and zero's shm (auto)
            "not reached",
            "-",
            str(STEPS),
            f"{held_bytes(s) / 1e6:,.1f}",  # parameters + gradients + optimizer state
            f"{max(s['memory_per_rank']['peak_rss']) / 1e6:,.1f}",
        ]
    _check_runs(out, {r["label"]: r for r in runs})


def _check_runs(out: str, runs: dict[str, Any]) -> None:
    """Each spec's own settings reached its run; memory as counted; plots, run folders."""
    # Adam: replicated 16 bytes a parameter; zero stage 3 on 2 workers about half of it
    psi = runs["allreduce:ring"]["summary"]["parameters"]
    for label, want in (("allreduce:ring", 16 * psi), ("localsgd:period=2", 16 * psi)):
        got = held_bytes(runs[label]["summary"])
        assert abs(got - want) <= 0.05 * want, (label, got, want)
    zero = runs["zero:3"]["summary"]
    assert abs(held_bytes(zero) - 8 * psi) <= 0.05 * 8 * psi, held_bytes(zero)
    assert zero["zero"]["stage"] == 3 and zero["world_size"] == 2
    assert runs["allreduce:ring"]["summary"]["config"]["algorithm"] == "ring"
    assert runs["localsgd:period=2"]["summary"]["config"]["period"] == 2
    plots = (
        "loss_vs_epoch.png",
        "throughput.png",
        "train_loss_vs_step.png",
        "time_breakdown.png",
        "memory.png",
    )
    for name in ("report.html", *plots):
        assert os.path.getsize(os.path.join(out, name)) > 1000
    for i, run in enumerate(runs.values(), 1):  # each run's folder is kept under the report's
        assert run["folder"] == os.path.join("runs", f"run-{i:02d}")
        folder = os.path.join(out, run["folder"])
        assert os.path.samefile(folder, run["summary"]["config"]["out"])
        for name in ("summary.json", "metrics.jsonl", "model.pt"):
            assert os.path.isfile(os.path.join(folder, name)), name


def _fake_summary(flags: dict[str, object]) -> dict[str, object]:
    evaluation = {
        "step": 2,
        "epoch": 0,
        "test_loss": 1.0,
        "test_accuracy": 0.95,
        "wall_seconds": 3.0,
        "bytes_sent": 10,
    }
    return {
        "final_accuracy": 0.95,
        "final_test_loss": 1.0,
        "wall_seconds": 3.5,
        "samples_per_second": 40.0,
        "bytes_sent_per_rank": 10.0,
        "steps": 2,
        "flags": flags,
        "metrics": [evaluation],
    }


def test_failed_run_is_reported_and_the_others_still_run(
    tmp_path: object, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from disttrain.launch import commands as runs

    calls: list[tuple[dict[str, object], list[str]]] = []

    def fake_train_run(
        flags: dict[str, object], timeout: float, launcher: list[str], out: str = ""
    ) -> object:
        calls.append((flags, list(launcher)))
        if flags["strategy"] == "ps":
            raise runs.RunFailed("train --strategy ps: disttrain: rank 1 stopped")
        return _fake_summary(flags)

    monkeypatch.setattr(runs, "train_run", fake_train_run)
    out = os.path.join(str(tmp_path), "cmp")
    argv = ["compare", "--strategies", "ps:async, localsgd:4", "--workers", "2", "--out", out]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "compare: ps:async failed: train --strategy ps: disttrain: rank 1 stopped" in err
    assert [c[0]["strategy"] for c in calls] == ["ps", "localsgd"]
    assert calls[1][0] == {"workers": 2, "strategy": "localsgd", "period": 4} and not calls[1][1]
    with open(os.path.join(out, "report.md")) as fh:
        report = fh.read()
    assert "| ps:async | failed: train --strategy ps: disttrain: rank 1 stopped |" in report
    assert "| localsgd:4 | ok | 0.9500 |" in report


def test_an_out_holding_an_earlier_comparison_is_refused_unless_overwrite(
    tmp_path: object, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As train refuses an --out with an earlier run's results: the report is kept."""
    from disttrain.launch import commands as runs

    monkeypatch.setattr(runs, "train_run", lambda flags, **_: _fake_summary(flags))
    out = os.path.join(str(tmp_path), "cmp")
    argv = ["compare", "--strategies", "localsgd:4, ps:async", "--workers", "2", "--out", out]
    assert main(argv) == 0
    with open(os.path.join(out, "report.md")) as fh:
        first = fh.read()
    capsys.readouterr()
    assert main(["compare", "--strategies", "localsgd:4", "--workers", "2", "--out", out]) == 2
    err = capsys.readouterr().err
    assert "already holds an earlier comparison (report.md, runs.json)" in err
    assert len(err.strip().splitlines()) == 1
    with open(os.path.join(out, "report.md")) as fh:
        assert fh.read() == first  # kept
    again = ["compare", "--strategies", "localsgd:4", "--workers", "2", "--out", out]
    assert main([*again, "--overwrite"]) == 0
    with open(os.path.join(out, "report.md")) as fh:
        assert "ps:async" not in fh.read()  # replaced, as asked


def test_cluster_runs_go_through_cluster_run(
    tmp_path: object, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--cluster: each run is `disttrain cluster run --name N -- ...`, --workers split by host."""
    from disttrain.cluster import hosts as cluster
    from disttrain.cluster import netns
    from disttrain.launch import commands as runs

    layout = cluster.plan("cmpt", 2, "100mbit")
    monkeypatch.setattr(netns, "check_tools", lambda: None)
    monkeypatch.setattr(cluster, "load", lambda name: layout if name == "cmpt" else None)
    calls: list[tuple[dict[str, object], list[str]]] = []

    def fake_train_run(
        flags: dict[str, object], timeout: float, launcher: list[str], out: str = ""
    ) -> object:
        calls.append((flags, list(launcher)))
        return _fake_summary(flags)

    monkeypatch.setattr(runs, "train_run", fake_train_run)
    out = os.path.join(str(tmp_path), "cmp")
    argv = [
        "compare",
        "--strategies",
        "allreduce:ring",
        "--workers",
        "4",
        "--cluster",
        "cmpt",
        "--run-timeout",
        "77",
        "--out",
        out,
    ]
    assert main(argv) == 0, capsys.readouterr().err
    flags, launcher = calls[0]
    assert flags["workers"] == 2  # 4 in all, over 2 hosts
    assert launcher[1:] == [
        "-m",
        "disttrain",
        "cluster",
        "run",
        "--name",
        "cmpt",
        "--timeout",
        "77.0",
        "--",
    ]
    with open(os.path.join(out, "report.md")) as fh:
        report = fh.read()
    assert "2 hosts x 2 workers, 100 Mbit/s per host link" in report and "workers=4" in report
    assert main([*argv[:4], "3", "--batch-size", "63", *argv[5:]]) == 2  # 3 workers, 2 hosts
    assert "not a multiple of the cluster's 2 hosts" in capsys.readouterr().err
