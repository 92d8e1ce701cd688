"""``dt.elastic.State`` (examples/elastic_state.py) under ``torchrun --max-restarts``.

A worker killed in epoch 2 of 4: torchrun restarts both workers, each restores the last
commit (epoch 2) and the final parameters equal an undisturbed run's bit for bit (every
epoch's data is its own, so the restarted epochs repeat exactly). A fresh job refuses a
root that holds another run's commits, in its restart round too. The undisturbed run and
the fresh job run on run_world's forked ranks: only the killed job needs torchrun.
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.harness import run_world
from tests.ports import free_port
from tests.test_api import TORCHRUN

REPO = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "GLOO_SOCKET_IFNAME": "lo",
    "OMP_NUM_THREADS": "1",
    "PYTHONPATH": str(REPO / "src"),
}


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # the c10d rendezvous: each restart round meets afresh (with --master-addr's static
    # one, the store keeps the first round's gloo addresses and a restarted rank may dial
    # a dead one)
    cmd = [
        str(TORCHRUN),
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--monitor-interval",
        "0.2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        str(REPO / "examples" / "elastic_state.py"),
        *args,
    ]
    return subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=240)


def _undisturbed(root: str, out: str) -> None:
    """The example's main on run_world's two ranks: the same script, data and optimizer as
    under torchrun, forked with torch imported once (torchrun's fresh interpreters cost
    about 10 CPU-s for this run)."""
    sys.argv = ["elastic_state.py", "--root", root, "--out", out]
    runpy.run_path(str(REPO / "examples" / "elastic_state.py"), run_name="__main__")


@pytest.mark.timeout(600)
def test_a_killed_worker_resumes_from_the_last_commit_and_ends_as_undisturbed(
    tmp_path: Path,
) -> None:
    run_world(_undisturbed, 2, args=(str(tmp_path / "a"), str(tmp_path / "a.pt")), timeout=120)
    killed = _run(tmp_path, "--root", "b", "--out", "b.pt", "--kill-rank", "1", "--kill-epoch", "2")
    assert killed.returncode == 0, killed.stderr[-3000:]
    assert "round 1: resumed=True from epoch 2, ended at 4" in killed.stdout, killed.stdout
    a, b = torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the two newest commits of the run are kept, nothing else
    steps = sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir())
    assert steps == ["step-00000003", "step-00000004"]
    # a fresh job into b refuses its commits (they belong to the run above), in its restart
    # round too: both rounds on two ranks sharing a job store, as torchrun's workers would
    # (its agent and four fresh workers cost ~19 CPU-s for two lines of refusal)
    again = run_world(_fresh_job, 2, args=(str(tmp_path / "b"),), timeout=120)
    assert [len(r) for r in again] == [2, 2], again
    assert all("holds another run's commits" in e for r in again for e in r), again


def _fresh_job(root: str) -> list[str]:
    """A fresh job's first round and its restart (TORCHELASTIC_RESTART_COUNT, as torchrun
    sets it) making a State on ``root``: each round's refusal."""
    import disttrain as dt
    from disttrain.comm.errors import UsageError

    refused = []
    for round_ in ("0", "1"):
        os.environ["TORCHELASTIC_RESTART_COUNT"] = round_
        try:
            dt.elastic.State(torch.nn.Linear(2, 2), root=root, epoch=0)
        except UsageError as exc:
            refused.append(str(exc))
    return refused


def test_restore_rolls_back_to_the_last_commit_in_one_process(tmp_path: Path) -> None:
    import disttrain as dt

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = dt.elastic.State(model, opt, root=str(tmp_path / "s"), epoch=0, note="a")
    assert state.restore() is False  # nothing committed yet
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    state.epoch, state.note = 3, "b"
    state.commit()
    kept = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = opt.state_dict()["state"][0]["momentum_buffer"].clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    opt.step()
    state.epoch = 7
    assert state.restore() is True
    assert all(torch.equal(kept[k], v) for k, v in model.state_dict().items())
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], momentum)
    assert (state.epoch, state.note, state.commits) == (3, "b", 1)
    with pytest.raises(AttributeError, match="name it when making it"):
        state.batch = 1  # not named when the state was made
    # on disk too, as the run's one commit (a restarted worker reads it: the test above)
    from disttrain import checkpoint

    assert checkpoint.runs(str(tmp_path / "s")) == {state._run: [1]}
