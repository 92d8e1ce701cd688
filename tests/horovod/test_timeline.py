"""hvd.start_timeline / stop_timeline on 2 ranks: rank 0 writes a Chrome trace of its calls
(NEGOTIATE_ALLREDUCE then ALLREDUCE, on a lane named after the call), the other rank
writes nothing, a second start records into a new file, and HOROVOD_TIMELINE records from
init to shutdown. Before init, Horovod's ValueError."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from disttrain.launch.spawn import run_world


def _lanes(path: str) -> dict[str, list[str]]:
    """lane name -> the names of its spans, in time order."""
    trace = json.loads(Path(path).read_text())
    events = trace["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    lanes: dict[str, list[str]] = {}
    for e in sorted((e for e in events if e["ph"] == "X"), key=lambda e: e["ts"]):
        lanes.setdefault(names[e["tid"]], []).append(e["name"])
    return lanes


def _record(folder: str) -> dict[str, Any]:
    import disttrain.horovod as hvd

    hvd.init()
    rank = hvd.rank()
    folder = os.path.join(folder, f"rank{rank}")  # each rank its own, as Horovod's test
    os.makedirs(folder)
    first, second = os.path.join(folder, "one.json"), os.path.join(folder, "two.json")
    hvd.start_timeline(first, mark_cycles=True)
    hvd.allreduce(torch.ones(3), name="test_allreduce")
    hvd.broadcast(torch.ones(2), root_rank=0, name="b")
    hvd.grouped_allreduce([torch.ones(1), torch.ones(2)], name="g")
    hvd.stop_timeline()
    hvd.allreduce(torch.ones(3), name="not_recorded")
    hvd.barrier()  # rank 0 has written before anyone looks
    out: dict[str, Any] = {"first": _lanes(first) if rank == 0 else os.path.exists(first)}
    hvd.start_timeline(second)
    hvd.allreduce(torch.ones(1), name="again")
    hvd.stop_timeline()
    hvd.stop_timeline()  # not recording: nothing to do
    hvd.barrier()
    out["second"] = _lanes(second) if rank == 0 else os.path.exists(second)
    # HOROVOD_TIMELINE: from init to shutdown
    hvd.shutdown()
    os.environ["HOROVOD_TIMELINE"] = os.path.join(folder, "env.json")
    hvd.init()
    hvd.allreduce(torch.ones(1), name="from_env")
    hvd.shutdown()
    del os.environ["HOROVOD_TIMELINE"]
    out["env"] = _lanes(os.path.join(folder, "env.json")) if rank == 0 else None
    return out


@pytest.mark.timeout(120)
def test_rank_zero_writes_each_calls_negotiation_and_data(tmp_path: Path) -> None:
    import disttrain.horovod as hvd

    with pytest.raises(ValueError, match="not been initialized"):
        hvd.start_timeline(str(tmp_path / "x.json"))
    rank0, rank1 = run_world(_record, world_size=2, args=(str(tmp_path),), timeout=90)
    both = ["NEGOTIATE_ALLREDUCE", "ALLREDUCE"]
    assert rank0["first"] == {
        "allreduce.test_allreduce": both,
        "broadcast.b": ["NEGOTIATE_BROADCAST", "BROADCAST"],
        "allreduce.g_1of2": both,
        "allreduce.g_2of2": both,
    }
    assert rank0["second"] == {"allreduce.again": both}
    assert rank0["env"]["allreduce.from_env"] == both
    assert rank1["first"] is False and rank1["second"] is False  # rank 0's file only
