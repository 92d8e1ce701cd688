"""`disttrain train --timeline FILE.json` end to end: what the merged trace shows per rank."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from disttrain.cli import main
from disttrain.parallel.pipeline import schedule
from tests.test_cli import run_cli
from tests.test_timeline import check_trace

Lanes = dict[tuple[int, str], list[dict[str, Any]]]


def _inside(events: list[dict[str, Any]], outer: dict[str, Any]) -> list[dict[str, Any]]:
    end = outer["ts"] + outer["dur"]
    return [e for e in events if outer["ts"] <= e["ts"] <= end and e is not outer]


def _steps(lanes: Lanes, rank: int) -> list[dict[str, Any]]:
    return [e for e in lanes[rank, "compute"] if e["name"] == "step"]


def _comm(lanes: Lanes, rank: int) -> list[dict[str, Any]]:
    # overlapping collectives may be spread over "comm", "comm #2", ...
    return [
        e for (r, lane), evs in lanes.items() if r == rank and lane.startswith("comm") for e in evs
    ]


@pytest.mark.timeout(300)
def test_an_overlapped_allreduce_run_shows_steps_buckets_and_overlap(tmp_path: Path) -> None:
    out, trace_path = tmp_path / "run", tmp_path / "trace.json"
    result = run_cli(
        "train",
        "--workers",
        "2",
        "--epochs",
        "1",
        "--max-steps",
        "3",
        "--fusion-mb",
        "0.01",
        "--overlap",
        "--out",
        str(out),
        "--timeline",
        str(trace_path),
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr
    trace = json.loads(trace_path.read_text())
    assert trace["otherData"] == {"clock": "CLOCK_MONOTONIC", "ranks": [0, 1]}
    lanes = check_trace(trace)
    summary = json.loads((out / "summary.json").read_text())
    buckets = summary["data_parallel"]["buckets"]
    assert buckets > 2
    overlapped = 0
    for rank in (0, 1):
        steps = _steps(lanes, rank)
        assert [s["args"]["step"] for s in steps] == [1, 2, 3]
        comm = _comm(lanes, rank)
        for step in steps:
            names = [e["name"] for e in _inside(lanes[rank, "compute"], step)]
            for name in ("forward", "backward", "sync", "optimizer"):
                assert names.count(name) == 1, (rank, step, names)
            assert names.count("wait") == buckets
            mine = _inside(comm, step)  # every bucket is summed within its step
            assert sorted(e["args"]["bucket"] for e in mine) == list(range(buckets))
            assert all(e["name"] == f"allreduce bucket {e['args']['bucket']}" for e in mine)
            assert sum(e["args"]["bytes"] for e in mine) == sum(
                summary["data_parallel"]["bucket_bytes"]
            )
            backward = next(
                e for e in _inside(lanes[rank, "compute"], step) if e["name"] == "backward"
            )
            overlapped += any(e["ts"] < backward["ts"] + backward["dur"] for e in mine)
        names = {e["name"] for e in lanes[rank, "compute"]}
        assert {"data", "eval"} <= names
    assert overlapped > 0  # some bucket was on the wire before its step's backward ended


@pytest.mark.timeout(300)
def test_a_gpipe_run_shows_each_microbatch_in_schedule_order(tmp_path: Path) -> None:
    trace_path = tmp_path / "pipe.json"
    result = run_cli(
        "train",
        "--workers",
        "2",
        "--strategy",
        "pipeline",
        "--schedule",
        "gpipe",
        "--microbatches",
        "4",
        "--epochs",
        "1",
        "--max-steps",
        "2",
        "--out",
        str(tmp_path / "p"),
        "--timeline",
        str(trace_path),
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr
    lanes = check_trace(json.loads(trace_path.read_text()))
    grid = schedule.build("gpipe", 4, 2)
    for stage in (0, 1):
        expected = [(a.kind, a.microbatch) for _, a in schedule.stage_actions(grid, stage)]
        assert len(expected) == 8
        for step in _steps(lanes, stage):
            inside = _inside(lanes[stage, "compute"], step)
            got = [
                (e["name"][0].upper(), e["args"]["microbatch"])
                for e in inside
                if e["name"] in ("forward", "backward")
            ]
            assert got == expected, (stage, got)
            assert all(
                e["args"]["stage"] == stage for e in inside if "microbatch" in e.get("args", {})
            )
            waits = [e for e in inside if e["name"] == "send/recv"]
            assert waits and all(e["args"]["peer_stage"] == 1 - stage for e in waits)
        assert len(_steps(lanes, stage)) == 2


@pytest.mark.timeout(300)
def test_without_the_flag_nothing_is_written(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run_cli(
        "train",
        "--workers",
        "2",
        "--epochs",
        "1",
        "--max-steps",
        "1",
        "--out",
        str(out),
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl", "model.pt", "summary.json"]
    assert list(tmp_path.iterdir()) == [out]


def test_a_timeline_in_a_missing_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "--timeline", str(tmp_path / "no" / "t.json")]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"disttrain: error: --timeline {tmp_path / 'no' / 't.json'}: "
        f"folder {tmp_path / 'no'} does not exist"
    ]


@pytest.mark.timeout(400)
def test_a_zb1_run_shows_b_and_w_apart_and_its_checkpoint_keeps_its_layout(
    tmp_path: Path,
) -> None:
    trace_path, out = tmp_path / "zb.json", tmp_path / "zb"
    result = run_cli(
        "train",
        "--workers",
        "2",
        "--strategy",
        "pipeline",
        "--schedule",
        "zb1",
        "--microbatches",
        "4",
        "--precision",
        "bf16",
        "--epochs",
        "1",
        "--max-steps",
        "2",
        "--checkpoint-every",
        "2",
        "--out",
        str(out),
        "--timeline",
        str(trace_path),
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr
    lanes = check_trace(json.loads(trace_path.read_text()))
    grid = schedule.build("zb1", 4, 2)
    names = {"forward": "F", "backward input": "B", "backward weight": "W"}
    for stage in (0, 1):
        expected = [(a.kind, a.microbatch) for _, a in schedule.stage_actions(grid, stage)]
        assert len(expected) == 12  # F, B and W of 4 micro-batches
        for step in _steps(lanes, stage):
            inside = _inside(lanes[stage, "compute"], step)
            got = [
                (names[e["name"]], e["args"]["microbatch"]) for e in inside if e["name"] in names
            ]
            assert got == expected, (stage, got)
    summary = json.loads((out / "summary.json").read_text())["pipeline"]
    assert summary["schedule"] == "zb1" and summary["bubble_theory"] == pytest.approx(1 / 13)
    # the checkpoint holds 1 stage per rank: an interleaved run (2 per rank) may not take it
    again = run_cli(
        "train",
        "--workers",
        "2",
        "--strategy",
        "pipeline",
        "--schedule",
        "interleaved",
        "--microbatches",
        "4",
        "--epochs",
        "1",
        "--max-steps",
        "3",
        "--resume",
        str(out),
        "--out",
        str(tmp_path / "again"),
        "--no-progress",
    )
    assert again.returncode != 0
    assert "resume with the same --schedule, --virtual-stages and --balance" in again.stderr
