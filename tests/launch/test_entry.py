"""``disttrain.train(config)`` in a process group it did not form: a plain group and torchrun.

The reference is one process training the same job at the same global batch: data
parallelism takes the same steps (to 1e-5, tests/train/test_equivalence.py), so the
test accuracy of the two-rank job must be the one-process job's to within one test
sample (1/360). Every rank must get rank 0's summary, and the ranks' places on the
host must come from the group when no launcher variable says (``LOCAL_RANK`` unset).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.harness import run_world
from tests.ports import free_port
from tests.test_api import TORCHRUN

REPO = Path(__file__).resolve().parents[2]
SETTINGS = {"max_steps": 6, "epochs": 1, "batch_size": 32, "progress": False, "timeout": 60.0}
ONE_SAMPLE = 1 / 360 + 1e-9  # digits' test set has 360 samples


def _reference(out: str) -> dict[str, Any]:
    import disttrain as dt

    return dt.train(SETTINGS, out=out)


def _in_own_group(store: str, out: str) -> dict[str, Any]:
    """Leave run_world's group, form one the way an engine would, without LOCAL_RANK."""
    import disttrain as dt
    from disttrain.comm import world

    rank, size = dt.rank(), dt.size()
    world.shutdown()
    for name in ("LOCAL_RANK", "DISTTRAIN_STORE_FILE"):
        os.environ.pop(name, None)
    dist.init_process_group("gloo", store=dist.FileStore(store, size), rank=rank, world_size=size)
    summary = dt.train(SETTINGS, out=out)
    place = (dt.local_rank(), dt.local_size(), dt.cross_rank(), dt.cross_size())
    owned = world.current().owns_group
    still = dt.allreduce(1.0, average=False)  # the group is still the engine's, and open
    dist.destroy_process_group()
    return {"summary": summary, "place": place, "owned": owned, "still": still}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = str(tmp_path_factory.mktemp("ref") / "run")
    return dict(run_world(_reference, 1, args=(out,), timeout=120)[0])


def test_train_in_a_group_formed_elsewhere_matches_one_process(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    out = str(tmp_path / "run")
    got = run_world(_in_own_group, 2, args=(str(tmp_path / "store"), out), timeout=150)
    first = got[0]["summary"]
    assert first["workers"] == 2 and first["steps"] == 6
    assert [g["summary"] for g in got] == [first, first]  # rank 0's summary on every rank
    assert abs(first["final_accuracy"] - reference["final_accuracy"]) <= ONE_SAMPLE
    assert [g["place"] for g in got] == [(0, 2, 0, 1), (1, 2, 0, 1)]  # from host names
    assert [g["owned"] for g in got] == [False, False]
    assert [g["still"] for g in got] == [2.0, 2.0]
    assert (Path(out) / "summary.json").is_file()


def test_train_under_torchrun_matches_one_process(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    cmd = [
        str(TORCHRUN),
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(REPO / "examples" / "train_api.py"),
        json.dumps({**SETTINGS, "out": str(tmp_path / "run")}),
    ]
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO / "src"),
    }
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    # the two ranks print at once: a line may hold both objects, so decode each one found
    found, decoder = [], json.JSONDecoder()
    for at in (i for i in range(len(proc.stdout)) if proc.stdout.startswith('{"', i)):
        try:
            found.append(decoder.raw_decode(proc.stdout, at)[0])
        except json.JSONDecodeError:
            continue
    lines = sorted(
        (d for d in found if isinstance(d, dict) and "rank" in d), key=lambda d: d["rank"]
    )
    assert [d["rank"] for d in lines] == [0, 1]
    assert [(d["local_rank"], d["local_size"], d["cross_size"]) for d in lines] == [
        (0, 2, 1),
        (1, 2, 1),
    ]
    assert lines[0]["run_id"] == lines[1]["run_id"] and lines[0]["workers"] == 2
    assert abs(lines[0]["accuracy"] - reference["final_accuracy"]) <= ONE_SAMPLE
    assert abs(lines[1]["accuracy"] - reference["final_accuracy"]) <= ONE_SAMPLE


def test_a_group_of_the_wrong_size_is_refused_in_one_line() -> None:
    from disttrain.comm.errors import UsageError
    from disttrain.launch.entry import fit_to_group, resolve_config

    cfg = resolve_config({"workers": 3})
    with pytest.raises(UsageError, match="needs 3 processes, but the process group has 2"):
        fit_to_group(cfg, 2)
    assert fit_to_group(resolve_config({"strategy": "ps"}), 3).train.workers == 2  # + 1 server
    with pytest.raises(UsageError, match="unknown setting 'bogus'"):
        resolve_config({"bogus": 1})
    assert torch.distributed.is_available()
