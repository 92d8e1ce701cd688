"""hvd.elastic: TorchState, ElasticSampler and run.

In one process: a commit and a restore of a model, its optimizer and plain values;
the sampler's shards (disjoint, covering), its epochs (a new order, the same on every
rank) and a "reset" onto another world size (a sampler made again with another
``num_replicas``, loading the committed state) that skips what was processed. In one
world of 2 ranks: ``run`` syncs rank 0's state, and a HorovodInternalError raised in the
function rolls back to the last commit (the sampler's indices joined over the ranks),
runs the reset callbacks and calls the function again. Under ``torchrun --max-restarts 1``
(elastic_worker.py): a worker SIGKILLed mid-run, and the restarted round goes on from the
job's last commit to the same end as an undisturbed run, no process left behind.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from disttrain.horovod.elastic import ElasticSampler, TorchState
from tests.harness import run_world
from tests.ports import free_port
from tests.test_api import TORCHRUN


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    model(torch.ones(2, 3)).sum().backward()
    opt.step()


def _params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [t.detach().clone() for t in model.state_dict().values()]


def test_commit_and_restore_round_trip_model_optimizer_and_values() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = TorchState(model, opt, epoch=0, batch=0, seen=["a"])
    _step(model, opt)
    state.epoch, state.batch = 2, 5
    state.seen.append("b")
    state.commit()
    kept, momentum = _params(model), opt.state_dict()["state"][0]["momentum_buffer"].clone()
    for _ in range(2):  # twice: a step after a restore must not move the commit
        _step(model, opt)
        state.epoch, state.batch = 9, 9
        state.seen.append("c")
        state.restore()
        assert all(torch.equal(a, b) for a, b in zip(_params(model), kept, strict=True))
        assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], momentum)
        assert (state.epoch, state.batch, state.seen) == (2, 5, ["a", "b"])
    assert state.model is model and state.optimizer is opt
    # a handled attribute set to a new object is committed at once (Horovod's rule)
    other = torch.nn.Linear(3, 2)
    state.model = other
    with torch.no_grad():
        other.weight.zero_()
    state.restore()
    assert state.model is other and not torch.equal(other.weight, torch.zeros(2, 3))
    calls: list[str] = []
    state.register_reset_callbacks([lambda: calls.append("x"), lambda: calls.append("y")])
    state.on_reset()
    assert calls == ["x", "y"]
    state.check_host_updates()  # nothing to check, no error
    assert TorchState().model is None


def _shards(n: int, world: int, **kw: Any) -> list[list[int]]:
    return [list(ElasticSampler(range(n), num_replicas=world, rank=r, **kw)) for r in range(world)]


def test_sampler_shards_cover_the_dataset_and_epochs_reshuffle() -> None:
    shards = _shards(12, 3)
    flat = [i for s in shards for i in s]
    assert sorted(flat) == list(range(12))  # disjoint and covering
    assert [len(s) for s in shards] == [4, 4, 4]
    padded = _shards(10, 3)  # 4 each, the last two wrap to the start
    assert [len(s) for s in padded] == [4, 4, 4]
    assert set(i for s in padded for i in s) == set(range(10))
    assert _shards(12, 3) == shards  # the same seed: the same order on every rank
    assert _shards(12, 3, seed=1) != shards
    assert _shards(4, 2, shuffle=False) == [[0, 2], [1, 3]]
    sampler = ElasticSampler(range(12), num_replicas=3, rank=0)
    sampler.set_epoch(1)
    again = ElasticSampler(range(12), num_replicas=3, rank=0)
    again.set_epoch(1)
    assert list(sampler) == list(again) != shards[0]
    assert len(sampler) == 4


def test_sampler_after_a_reset_skips_the_processed_indices_on_a_new_world_size() -> None:
    ranks = [ElasticSampler(range(20), seed=3, num_replicas=2, rank=r) for r in range(2)]
    for s in ranks:
        s.record_batch(0, 3)  # batches 0 and 1 of 3 samples done on both ranks
        s.record_batch(1, 3)
    done = {i for s in ranks for b in (0, 1) for i in s.get_indices(b, 3)}
    assert len(done) == 12
    assert ranks[0].processed_indices == ranks[1].processed_indices == done
    order = list(range(20))
    random.Random(3).shuffle(order)
    assert done == set(order[:12])  # a prefix of the epoch's order (Horovod 0.28's count)
    committed = ranks[0].state_dict()
    new = [ElasticSampler(range(20), seed=3, num_replicas=3, rank=r) for r in range(3)]
    for s in new:
        s.load_state_dict(committed)
    left = [list(s) for s in new]
    assert [len(s) for s in left] == [3, 3, 3]  # 8 left over 3 ranks, one padded
    assert set(i for s in left for i in s) == set(order[12:])
    assert not done & set(i for s in left for i in s)
    # Horovod 0.28's state (a count) loads as the same prefix
    old = ElasticSampler(range(20), seed=3, num_replicas=3, rank=0)
    old.load_state_dict({"epoch": 0, "processed_num": 12})
    assert list(old) == left[0]
    # record_indices: one rank's own indices; set_epoch forgets them all
    new[0].record_indices(left[0][:1])
    assert new[0].processed_num == 13
    new[0].set_epoch(1)
    assert new[0].processed_num == 0 and len(new[0]) == 7


def _elastic_run() -> dict[str, Any]:
    import disttrain.horovod as hvd

    hvd.init()
    rank = hvd.rank()
    torch.manual_seed(rank)  # a different model per rank: the sync must fix it
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    sampler = hvd.elastic.ElasticSampler(range(10), seed=1)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, sched=sched, epoch=rank + 1)
    out: dict[str, Any] = {"calls": [], "resets": []}
    state.register_reset_callbacks([lambda: out["resets"].append(len(out["calls"]))])

    @hvd.elastic.run
    def train(state: Any, tag: str) -> str:
        out["calls"].append((state.epoch, _params(state.model), state.sampler.processed_num))
        if len(out["calls"]) > 1:
            out["lr"] = opt.param_groups[0]["lr"]
            return tag
        _step(state.model, opt)
        state.sched.step()
        # each rank its own indices: the commit joins them
        state.sampler.record_indices(state.sampler.get_indices(0, 2))
        state.epoch = 2
        state.commit()
        out["committed"] = _params(state.model)
        _step(state.model, opt)
        state.sched.step()
        state.epoch = 7
        raise hvd.HorovodInternalError("lost a peer (pretend)")

    out["returned"] = train(state, "done")
    out["processed"] = sorted(sampler.processed_indices)
    out["left"] = list(sampler)
    hvd.shutdown()
    return out


@pytest.mark.timeout(120)
def test_run_syncs_rolls_back_to_the_commit_and_retries() -> None:
    results = run_world(_elastic_run, world_size=2, timeout=90)
    order = list(range(10))
    random.Random(1).shuffle(order)
    for out in results:
        assert out["returned"] == "done"
        (epoch1, _first, n1), (epoch2, second, n2) = out["calls"]
        assert (epoch1, n1) == (1, 0)  # rank 0's value, synced at the start
        assert (epoch2, n2) == (2, 4)  # the commit's: both ranks' 2 indices each
        assert all(torch.equal(a, b) for a, b in zip(second, out["committed"], strict=True))
        assert out["resets"] == [1]
        assert out["lr"] == pytest.approx(0.05)  # the scheduler's one committed step
        assert out["processed"] == sorted(order[:4])
    # the same start on both ranks (rank 0's model), and the same commit
    for a, b in zip(results[0]["calls"][0][1], results[1]["calls"][0][1], strict=True):
        assert torch.equal(a, b)
    assert sorted(results[0]["left"] + results[1]["left"]) == sorted(order[4:])


def _torchrun(out: Path) -> subprocess.Popen[str]:
    """2 workers of elastic_worker.py; the c10d rendezvous, so each restart round meets
    afresh (tests/test_elastic.py says why); a session of its own, to kill it whole."""
    cmd = [str(TORCHRUN), "--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "1"]
    cmd += ["--monitor-interval", "0.1", "--rdzv-backend", "c10d"]
    cmd += ["--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    cmd += [str(Path(__file__).with_name("elastic_worker.py")), str(out)]
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo / "src"), "OMP_NUM_THREADS": "1"}
    env["GLOO_SOCKET_IFNAME"] = "lo"
    return subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _kill_when_asked(out: Path, job: subprocess.Popen[str], within: float) -> int:
    """SIGKILL the worker that wrote out/kill-me (rank 1, one step past a commit)."""
    deadline = time.monotonic() + within
    while not (out / "kill-me").exists():
        assert job.poll() is None, "the job ended before its worker was killed"
        assert time.monotonic() < deadline, "no worker asked to be killed"
        time.sleep(0.05)
    pid = int((out / "kill-me").read_text())
    os.kill(pid, signal.SIGKILL)
    return pid


def _undisturbed() -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The worker's training in one process: each step's gradient averaged over the
    2 ranks' batches (what DistributedOptimizer gives), from round 0's rank 0 model."""
    from tests.horovod import elastic_worker as w

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(w.STEPS):
        sgd.zero_grad()
        losses = [
            torch.nn.functional.mse_loss(model(x), y)
            for x, y in (w.batch(step, r) for r in range(2))
        ]
        (sum(losses) / 2).backward()
        sgd.step()
    return w.params(model), [sgd.state[p]["momentum_buffer"] for p in model.parameters()]


@pytest.mark.timeout(90)
def test_a_worker_killed_mid_run_resumes_from_the_last_commit_under_torchrun(
    tmp_path: Path,
) -> None:
    from tests.horovod.elastic_worker import KILL_AT, STEPS

    job = _torchrun(tmp_path)
    try:
        killed = _kill_when_asked(tmp_path, job, within=40)
        log, _ = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert job.returncode == 0, log[-3000:]
    assert (tmp_path / "pid-0-1").read_text() == str(killed)
    ends = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    last_commit = KILL_AT - KILL_AT % 2  # committed every second step
    committed = torch.load(tmp_path / f"commit-{last_commit}.pt")
    expected, momentum = _undisturbed()
    for end in ends:
        assert end["round"] == 1  # both ended in the restarted round
        assert end["start_step"] == last_commit
        assert torch.equal(end["start_params"], committed)  # the commit, bit for bit
        assert end["step"] == STEPS and end["done"] == list(range(1, STEPS + 1))
        torch.testing.assert_close(end["params"], expected)
        for got, want in zip(end["momentum"], momentum, strict=True):
            torch.testing.assert_close(got, want)
    assert torch.equal(ends[0]["params"], ends[1]["params"])  # the ranks agree exactly
    # no worker of either round outlives the job
    pids = [int(p.read_text()) for p in tmp_path.glob("pid-*-*")]
    assert len(pids) == 4
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
