"""The timeline recorder and the merge of per-rank parts into one Chrome-trace file."""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch

from disttrain import timeline


@pytest.fixture(autouse=True)
def _off_afterwards() -> Any:
    yield
    timeline.stop()


def check_trace(trace: dict[str, Any]) -> dict[tuple[int, str], list[dict[str, Any]]]:
    """Assert the Trace Event Format schema; return the X events by (rank, lane name)."""
    assert set(trace) >= {"traceEvents"}
    events = trace["traceEvents"]
    process = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"
    }
    by_lane: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        assert e["ph"] in ("X", "M", "i"), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "M":
            continue
        assert process[e["pid"]] == f"rank {e['pid']}"
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            by_lane[e["pid"], threads[e["pid"], e["tid"]]].append(e)
    for lane in by_lane.values():  # written in time order, and properly nested on each lane
        starts = [e["ts"] for e in lane]
        assert starts == sorted(starts)
        open_ends: list[float] = []
        for e in lane:
            # one span ending where the next begins may read 1e-11 µs later (float rounding)
            while open_ends and open_ends[-1] <= e["ts"] + 1e-6:
                open_ends.pop()
            if open_ends:  # inside an enclosing span: must end within it (1 ns of rounding)
                assert e["ts"] + e["dur"] <= open_ends[-1] + 0.002, e
            open_ends.append(e["ts"] + e["dur"])
    return by_lane


def test_off_is_a_shared_no_op() -> None:
    assert timeline.current() is timeline.OFF
    assert timeline.span("a") is timeline.span("b", "comm", x=1)  # one shared object
    items = [1, 2]
    assert timeline.iterate(items, "data") is items
    timeline.instant("x")
    fut: torch.futures.Future[int] = torch.futures.Future()
    timeline.track(fut, "comm")
    fut.set_result(1)
    with timeline.span("a"):
        pass


def test_nested_spans_args_instants_and_threads() -> None:
    rec = timeline.start(rank=3)
    assert timeline.current() is rec
    with timeline.span("step", step=1):
        with timeline.span("forward"):
            time.sleep(0.002)
        timeline.instant("mark", note="x")
        with timeline.span("backward"):
            time.sleep(0.002)
    worker = threading.Thread(target=lambda: timeline.span("bucket", "comm").__enter__())
    worker.start()
    worker.join()
    with timeline.span("allreduce", "comm", bucket=0, bytes=8):
        pass
    timeline.stop()
    with timeline.span("after stop"):
        pass
    names = [e["name"] for e in rec.events]
    assert names == ["forward", "mark", "backward", "step", "allreduce"]
    ev = {e["name"]: e for e in rec.events}
    step, fwd, bwd = ev["step"], ev["forward"], ev["backward"]
    assert step["ts"] <= fwd["ts"] and fwd["ts"] + fwd["dur"] <= bwd["ts"]
    assert bwd["ts"] + bwd["dur"] <= step["ts"] + step["dur"]
    assert fwd["dur"] >= 2_000_000  # ns
    assert step["args"] == {"step": 1} and ev["allreduce"]["args"] == {"bucket": 0, "bytes": 8}
    assert ev["allreduce"]["tid"] == "comm" and ev["mark"]["ph"] == "i"


def test_iterate_records_each_wait() -> None:
    rec = timeline.start(rank=0)

    def slow() -> Any:
        for i in range(3):
            time.sleep(0.001)
            yield i

    assert list(timeline.iterate(slow(), "data")) == [0, 1, 2]
    assert [e["name"] for e in rec.events] == ["data"] * 3
    assert all(e["dur"] >= 1_000_000 for e in rec.events)


def test_tracked_work_ends_when_it_completes() -> None:
    rec = timeline.start(rank=0)
    a: torch.futures.Future[int] = torch.futures.Future()
    b: torch.futures.Future[int] = torch.futures.Future()
    timeline.track(a, "bucket 0", in_order=True, bucket=0)
    timeline.track(b, "bucket 1", in_order=True, bucket=1)
    time.sleep(0.003)
    a.set_result(0)
    time.sleep(0.002)
    b.set_result(0)
    first, second = rec.events
    assert first["dur"] >= 3_000_000 and first["args"]["bucket"] == 0
    # in order: the second starts when the first ended, having queued behind it
    assert second["ts"] == first["ts"] + first["dur"]
    assert second["args"]["queued_us"] >= 3000 and second["dur"] >= 2_000_000


def _part(folder: Path, rank: int, host: str, offset: int, events: list[dict[str, Any]]) -> None:
    rec = timeline.Recorder(rank)
    rec.events = events
    rec.wall_offset_ns = offset
    part = rec.part()
    part["host"] = host
    (folder / f"rank{rank}.json").write_text(json.dumps(part))


def _x(name: str, lane: str, ts: int, dur: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "ph": "X", "tid": lane, "ts": ts, "dur": dur, **extra}


def test_merge_writes_one_valid_trace(tmp_path: Path) -> None:
    parts = tmp_path / "parts"
    parts.mkdir()
    base = 5_000_000_000
    _part(
        parts,
        1,
        "h",
        0,
        [
            _x("backward", "compute", base + 3000, 4000),
            _x("step", "compute", base + 1000, 9000),
            _x("allreduce bucket 0", "comm", base + 4000, 1000, args={"bucket": 0, "bytes": 40}),
        ],
    )
    _part(parts, 0, "h", 0, [_x("forward", "compute", base, 2000, args={"microbatch": 0})])
    (parts / "rank2.json.tmp").write_text("{half a part")  # never read
    out = tmp_path / "trace.json"
    info = timeline.merge(str(parts), str(out))
    assert info == {"clock": "CLOCK_MONOTONIC", "ranks": [0, 1]}
    trace = json.loads(out.read_text())
    lanes = check_trace(trace)
    assert set(lanes) == {(0, "compute"), (1, "compute"), (1, "comm")}
    assert lanes[0, "compute"][0] == {
        "name": "forward",
        "ph": "X",
        "pid": 0,
        "tid": 1,
        "ts": 0.0,
        "dur": 2.0,
        "args": {"microbatch": 0},
    }
    # the enclosing step comes before the backward inside it; microseconds from the first event
    assert [(e["name"], e["ts"], e["dur"]) for e in lanes[1, "compute"]] == [
        ("step", 1.0, 9.0),
        ("backward", 3.0, 4.0),
    ]
    assert lanes[1, "comm"][0]["args"] == {"bucket": 0, "bytes": 40}
    meta = {(e["name"], e["pid"], e["tid"]) for e in trace["traceEvents"] if e["ph"] == "M"}
    assert ("thread_name", 1, 2) in meta and ("process_sort_index", 0, 0) in meta


def test_overlapping_async_spans_get_sub_lanes(tmp_path: Path) -> None:
    # gloo may run two collectives side by side: they overlap without nesting
    _part(
        tmp_path,
        0,
        "h",
        0,
        [
            _x("b0", "comm", 0, 100, **{"async": True}),
            _x("b1", "comm", 50, 100, **{"async": True}),
            _x("b2", "comm", 120, 10, **{"async": True}),
        ],
    )
    out = tmp_path / "t.json"
    timeline.merge(str(tmp_path), str(out))
    lanes = check_trace(json.loads(out.read_text()))
    assert [e["name"] for e in lanes[0, "comm"]] == ["b0", "b2"]
    assert [e["name"] for e in lanes[0, "comm #2"]] == ["b1"]
    assert all("async" not in e for lane in lanes.values() for e in lane)


def test_ranks_of_several_hosts_are_aligned_by_the_wall_clock(tmp_path: Path) -> None:
    # the same wall-clock moment: monotonic 1_000_000 on host a, 9_000_000 on host b
    _part(tmp_path, 0, "a", 10_000_000, [_x("step", "compute", 1_000_000, 1000)])
    _part(tmp_path, 1, "b", 2_000_000, [_x("step", "compute", 9_000_000, 1000)])
    out = tmp_path / "t.json"
    assert timeline.merge(str(tmp_path), str(out))["clock"].startswith("wall clock")
    lanes = check_trace(json.loads(out.read_text()))
    assert lanes[0, "compute"][0]["ts"] == lanes[1, "compute"][0]["ts"] == 0.0


def test_a_recorder_writes_its_part_and_merges(tmp_path: Path) -> None:
    rec = timeline.start(rank=0)
    with timeline.span("step", step=1), timeline.span("forward"):
        pass
    path = rec.write(str(tmp_path / "parts"))
    assert path.endswith("rank0.json")
    out = tmp_path / "trace.json"
    timeline.merge(str(tmp_path / "parts"), str(out))
    lanes = check_trace(json.loads(out.read_text()))
    assert [e["name"] for e in lanes[0, "compute"]] == ["step", "forward"]
    assert timeline.parts_folder("run", "t.json") == "run/timeline"
    assert timeline.parts_folder("", "t.json") == "t.json.parts"
