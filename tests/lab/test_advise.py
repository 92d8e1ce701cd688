"""`disttrain advise`: units, the ranked table, the calibration file, bad input (exit 2)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

from disttrain.cli import main
from disttrain.comm.errors import UsageError
from disttrain.lab.advise import parse_count, parse_duration
from disttrain.lab.calibration import Calibration
from tests import zygote


def test_units() -> None:
    assert parse_count("25M", "--params") == 25e6
    assert parse_count("1.5B", "--params") == 1.5e9
    assert parse_count("350k", "--params") == 350e3
    assert parse_count("10000", "--nodes") == 10_000
    assert parse_count("20T", "--flops") == 20e12
    assert parse_duration("5us", "--latency") == pytest.approx(5e-6)
    assert parse_duration("0.2ms", "--latency") == pytest.approx(2e-4)
    assert parse_duration("1s", "--latency") == 1.0
    assert parse_duration("30ns", "--latency") == pytest.approx(3e-8)
    for bad in ("", "M", "25X", "-3M", "0", "1e"):
        with pytest.raises(UsageError):
            parse_count(bad, "--params")
    for bad in ("5", "5 parsecs", "-1us", "2h", "120s"):
        with pytest.raises(UsageError):
            parse_duration(bad, "--latency")


def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No calibration file from the user's home leaks into the test."""
    monkeypatch.setattr("disttrain.lab.advise.DEFAULT_PATH", str(tmp_path / "none.json"))


def test_ranked_table_and_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _isolated(tmp_path, monkeypatch)
    out = tmp_path / "rows.json"
    code = main(
        [
            "advise",
            "--params",
            "25M",
            "--nodes",
            "256",
            "--bandwidth",
            "25Gbit",
            "--latency",
            "5us",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "allreduce:ring" in text and "built-in defaults" in text
    rows = json.loads(out.read_text())["rows"]
    steps = [r["step_seconds"] for r in rows if r["step_seconds"] is not None]
    assert steps == sorted(steps) and len(steps) > 10
    # then the rows without a step: tensor (not modelled) and the pipelines, which
    # cannot cut 256 stages from a 10-layer model (no memory, and so no step either)
    unranked = {r["strategy"]: r for r in rows[len(steps) :]}
    assert set(unranked) == {"tensor"} | {s for s in unranked if s.startswith("pipeline:")}
    assert len(unranked) == 5  # tensor and the 4 schedules' rows
    assert all(r["reason"] for r in rows)
    assert all(r["memory"]["total"] > 0 for r in rows[: len(steps)])
    # the cost part's own reason (strategies/cost/tensor.py), not a pointer to the docs
    assert unranked["tensor"]["reason"].startswith("tensor is not modelled: its step depends")
    for label, row in unranked.items():
        if label != "tensor":
            assert row["memory"] is None and row["step_seconds"] is None
            assert (
                "cannot run so: " in row["reason"] and "stages need as many layers" in row["reason"]
            )
    assert json.loads(out.read_text())["network"]["beta"] == pytest.approx(8 / 25e9)


def test_latency_and_size_change_the_winner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _isolated(tmp_path, monkeypatch)
    out = tmp_path / "rows.json"

    def first(params: str, latency: str) -> str:
        main(
            [
                "advise",
                "--params",
                params,
                "--nodes",
                "64",
                "--bandwidth",
                "10gbit",
                "--latency",
                latency,
                "--fusion-mb",
                "0",
                "--json",
                str(out),
                "--strategies",
                "allreduce:ring,allreduce:butterfly,allreduce:tree",
            ]
        )
        return str(json.loads(out.read_text())["rows"][0]["strategy"])

    assert first("1K", "100us") in ("allreduce:butterfly", "allreduce:tree")
    assert first("100M", "1us") == "allreduce:ring"


def test_uses_the_calibration_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _isolated(tmp_path, monkeypatch)
    path = tmp_path / "cal.json"
    Calibration(seconds_per_flop=1e-9, source="calibrated on a test box").save(str(path))
    out = tmp_path / "rows.json"
    assert (
        main(
            [
                "advise",
                "--params",
                "1M",
                "--nodes",
                "4",
                "--calibration",
                str(path),
                "--strategies",
                "allreduce:ring",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    assert "calibrated on a test box" in capsys.readouterr().out
    row = json.loads(out.read_text())["rows"][0]
    # 32 samples per node x 6 flops per parameter x 1M parameters x 1 ns
    assert row["compute_seconds"] == pytest.approx(32 * 6e6 * 1e-9 + 1e6 * 5e-9)


@pytest.mark.parametrize(
    "flags",
    [
        ["--params", "25X", "--nodes", "4"],
        ["--params", "25M", "--nodes", "10001"],
        ["--params", "25M", "--nodes", "2.5"],
        ["--params", "25M", "--bandwidth", "fast"],
        ["--params", "25M", "--bandwidth", "25Gbit", "--latency", "5 lightyears"],
        ["--params", "25M", "--batch-size", "2", "--nodes", "4"],
        ["--params", "25M", "--strategies", "allreduce:nope"],
        ["--params", "25M", "--strategies", "localsgd:0"],
        ["--params", "25M", "--servers", "0"],
        ["--params", "25M", "--calibration", "/no/such/file.json"],
        ["--nodes", "4"],
        ["--calibrate", "--workers", "1"],
        ["--params", "25M", "--memory-per-worker", "2G"],
        ["--params", "25M", "--memory-per-worker", "0GB"],
        ["--params", "25M", "--model", "mlp"],
        ["--model", "mlp", "--layers", "4"],
        ["--params", "25M", "--layers", "0"],
        ["--params", "25M", "--dataset", "digits"],
        ["--model", "nope"],
        ["--params", "25M", "--optimizer", "lamb"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    flags: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _isolated(tmp_path, monkeypatch)
    try:
        code = main(["advise", *flags])
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0], lines


def test_bad_input_from_the_command_line() -> None:
    proc = zygote.run(
        [sys.executable, "-m", "disttrain", "advise", "--params", "25M", "--bandwidth", "100mbps!"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--bandwidth" in proc.stderr


@pytest.mark.parametrize("columns", [80, 132, 200])
def test_table_fits_the_terminal_and_ends_with_a_recommendation(
    columns: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _isolated(tmp_path, monkeypatch)
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["advise", "--params", "25M", "--nodes", "64", "--bandwidth", "10Gbit"]) == 0
    lines = capsys.readouterr().out.rstrip("\n").splitlines()
    assert max(len(line) for line in lines[:-1]) <= columns, "\n".join(lines)
    header = next(i for i, line in enumerate(lines) if "step ms" in line)
    assert "allreduce:ring" in "".join(lines)
    if columns >= 160:  # room for every column, the reasons included
        assert "why" in lines[header] and "compute ms" in lines[header], lines[header]
    if "why" not in lines[header]:  # a row shown as "-" still says why, below the table
        dashed = [x.split("│")[1].strip() for x in lines if x.startswith("│") and " - " in x]
        assert dashed and all(any(x.startswith(f"  {d}") for x in lines) for d in dashed), lines
    names = [h.strip() for h in lines[header].split("┃")]
    figures = [i for i, h in enumerate(names) if h.endswith(("ms", "step", "/s", "worker"))]
    for row in (x.split("│") for x in lines if x.startswith("│")):
        assert not [row[i] for i in figures if re.search(r"\de[+-]\d", row[i])], row  # 1.2e+04
    last = lines[-1]  # one line naming the fastest row and why
    assert last.startswith("recommendation: for 25M parameters on 64 nodes at 10 Gbit/s: ")
    best = last.split(": ")[2].split(" (")[0]
    first_row = lines[header + 2]
    assert best in first_row and ", because " in last, (best, first_row)


def test_a_transformers_pipeline_is_priced_at_its_split_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 50's "the lab prices the split model": advise takes the user's transformers
    model (GPT-2, its head tied to its embedding) and the split points training takes; the
    fullest stage's parameters are what it holds, the tied weight on both of its stages."""
    from examples.workloads import gpt2

    _isolated(tmp_path, monkeypatch)
    out = tmp_path / "rows.json"
    even, late = (f"pipeline:1f1b:split_points=transformer.{p}" for p in ("h.1", "ln_f"))
    argv = ["advise", "--model", "examples.workloads:gpt2", "--nodes", "2"]
    assert main([*argv, "--strategies", f"{even},{late}", "--json", str(out)]) == 0
    rows = {r["strategy"]: r for r in json.loads(out.read_text())["rows"]}
    model = gpt2()
    t = model.transformer

    def n(*modules: torch.nn.Module) -> int:
        return sum(p.numel() for m in modules for p in m.parameters())

    embeddings, head = n(t.wte, t.wpe), n(t.ln_f, model.lm_head)  # wte's weight in both
    want = {even: max(embeddings + n(t.h[0]), n(t.h[1]) + head), late: embeddings + n(t.h)}
    for spec, params in want.items():
        assert rows[spec]["memory"]["parameters"] == 4 * params  # fp32
        assert rows[spec]["step_seconds"] > 0
        assert "stages of split at transformer." in rows[spec]["note"], rows[spec]
    # the split the model's own forward cannot start at: one line, exit 2 (as training)
    code = main([*argv, "--strategies", "pipeline:1f1b:split_points=transformer.h.9"])
    assert code == 2
