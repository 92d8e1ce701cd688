"""Live shrink (``--min-workers``) through the real command, and the survivors' agreement.

The equivalence behind the parameter checks: synchronous data parallelism at global batch
B takes the steps one process takes at batch B (tests/train/test_equivalence.py), whatever
the worker count, and a step the survivors run again starts from the state every replica
held before it. So 3 workers that lose one at step 3 of 8 and go on with 2 must end where
one process trained on the same 8 global batches ends. Tolerance: max |difference| <=
1e-5 over all parameters (only the order of float sums differs; one step's update is
~1e-3 here, so a step lost or run twice would be seen).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from disttrain.train.shrink import ANSWER_DELAY_ENV
from tests.harness import run_world
from tests.netcheck import alive
from tests.train.test_faults import REPO, _Job, _with_arg

TIMEOUT = 5
SHRINK = (
    "--workers",
    "3",
    "--min-workers",
    "2",
    "--batch-size",
    "24",
    "--max-steps",
    "8",
    "--seed",
    "3",
    "--no-progress",
    "--timeout",
    str(TIMEOUT),
)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """One process on the same 8 global batches."""
    out = tmp_path_factory.mktemp("one")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "disttrain",
            "train",
            "--workers",
            "1",
            "--batch-size",
            "24",
            "--max-steps",
            "8",
            "--seed",
            "3",
            "--no-progress",
            "--out",
            str(out),
        ],
        cwd=REPO,
        check=True,
        timeout=240,
        stdout=subprocess.DEVNULL,
    )
    return torch.load(out / "model.pt", weights_only=True)  # type: ignore[no-any-return]


def _check_run(out: Path, reference: dict[str, torch.Tensor], lost: list[int]) -> dict:  # type: ignore[type-arg]
    summary = json.loads((out / "summary.json").read_text())
    (change,) = summary["membership"]
    assert {k: change[k] for k in ("step", "workers", "before", "lost")} == {
        "step": 3,
        "workers": 2,
        "before": 3,
        "lost": lost,
    }
    assert summary["workers"] == 2 and summary["steps"] == 8
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "loss" in r] == list(range(1, 9))  # each step once
    assert [r["lost"] for r in lines if r.get("event") == "membership"] == [lost]
    params = torch.load(out / "model.pt", weights_only=True)
    worst = max(float((params[k] - reference[k]).abs().max()) for k in reference)
    assert worst <= 1e-5, f"differs from one process by {worst:.2e}"
    return change  # type: ignore[no-any-return]


def _nothing_left(job: _Job, out: Path) -> None:
    time.sleep(0.5)  # let the kernel reap what ended
    left = [p for p in job.pids if alive(p)] + _with_arg(str(out))
    assert not left, f"processes left behind: {left}"


@pytest.mark.timeout(420)
@pytest.mark.parametrize("algorithm", ["native", "ring"])
def test_a_killed_worker_is_left_behind_and_training_matches_one_process(
    algorithm: str, tmp_path: Path, reference: dict[str, torch.Tensor]
) -> None:
    out = tmp_path / algorithm
    trace = tmp_path / f"{algorithm}.json"
    job = _Job(
        [
            *SHRINK,
            "--algorithm",
            algorithm,
            "--inject-fault",
            "kill:rank=2:step=3",
            "--out",
            str(out),
            "--timeline",
            str(trace),
        ]
    )
    code, _ = job.wait(limit=240)
    assert code == 0, job.stderr
    assert "rank(s) 2 lost at step 3" in job.stderr, job.stderr
    assert "2 of 3 workers run step 3 again" in job.stderr, job.stderr
    change = _check_run(out, reference, lost=[2])
    # the killed process is seen gone: the survivors do not wait out the answer window
    assert change["waited_out_window"] is False, change
    events = json.loads(trace.read_text())["traceEvents"]
    marks = [e["args"] for e in events if e.get("name") == "membership change"]
    assert marks and all(m["lost"] == [2] for m in marks), marks  # each survivor's moment
    _nothing_left(job, out)


@pytest.mark.timeout(420)
@pytest.mark.parametrize(("algorithm", "killed"), [("native", 0), ("ring", 1)])
def test_one_of_four_killed_leaves_three_every_survivor_kept(
    algorithm: str, killed: int, tmp_path: Path
) -> None:
    # 3 survivors: one of them is still blocked in the step's allreduce on the other two
    # when they leave. Unless a leaving survivor shuts its group's sockets down
    # (comm.world.leave_group), whatever holds its gloo Work or group keeps them open, the
    # blocked one waits out --timeout, answers the roll call too late and is left out:
    # exit 1, "fewer than --min-workers 3" (both cases failed so before the fix).
    out = tmp_path / "four"
    fault = f"kill:rank={killed}:step=3"
    job = _Job(
        [
            "--workers",
            "4",
            "--min-workers",
            "3",
            "--batch-size",
            "48",
            "--max-steps",
            "6",
            "--seed",
            "3",
            "--no-progress",
            "--timeout",
            str(TIMEOUT),
            "--algorithm",
            algorithm,
            "--inject-fault",
            fault,
            "--out",
            str(out),
        ]
    )
    code, _ = job.wait(limit=240)
    assert code == 0, job.stderr
    (change,) = json.loads((out / "summary.json").read_text())["membership"]
    assert (change["lost"], change["workers"]) == ([killed], 3), change
    assert change["waited_out_window"] is False, change
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "loss" in r] == list(range(1, 7))  # each step once
    _nothing_left(job, out)


def _survived(out: Path, fault: str) -> tuple[_Job, Path]:
    """The shrink job with ``fault`` (heartbeat timeout 2 s), ended with exit 0."""
    job = _Job([*SHRINK, "--inject-fault", fault, "--heartbeat-timeout", "2", "--out", str(out)])
    code, _ = job.wait(limit=240)
    assert code == 0, job.stderr
    return job, out


@pytest.mark.timeout(420)
def test_a_hung_worker_is_left_behind_after_the_timeout_and_ended(
    tmp_path: Path, reference: dict[str, torch.Tensor]
) -> None:
    job, out = _survived(tmp_path / "hang", "hang:rank=1:step=3")
    assert "rank(s) 1 lost at step 3" in job.stderr, job.stderr
    change = _check_run(out, reference, lost=[1])
    # the step's collective waits --timeout; the hung process is alive (it heartbeats) and
    # might still answer, so the survivors wait for it, up to --timeout plus the
    # heartbeat timeout (the time: docs/reliability.md)
    assert change["waited_out_window"] is True, change
    assert change["why"]["1"].startswith("alive but idle"), change
    assert change["why"]["1"].endswith("(hung)"), change
    _nothing_left(job, out)  # the hung process was ended by the survivors


@pytest.mark.timeout(420)
def test_a_survivor_slow_to_answer_is_kept_while_it_heartbeats(
    tmp_path: Path, reference: dict[str, torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    # rank 1 answers the survivors' agreement 4 s late, its heartbeat going on: it is
    # alive, so it is waited for (up to --timeout plus the heartbeat timeout). The old
    # fixed 3 s answer window left it out: 1 worker left, exit 1, as in issue 51's loaded
    # runs (rank 3 late by more than 3 s); checked by setting the wait back to 3 s.
    monkeypatch.setenv(ANSWER_DELAY_ENV, "1:4")
    job, out = _survived(tmp_path / "slow", "kill:rank=2:step=3")
    assert "2 of 3 workers run step 3 again" in job.stderr, job.stderr
    change = _check_run(out, reference, lost=[2])
    assert change["why"] == {"2": "its process is gone"}, change
    _nothing_left(job, out)


@pytest.mark.timeout(420)
def test_a_stopped_worker_is_dropped_once_its_heartbeat_lapses(
    tmp_path: Path, reference: dict[str, torch.Tensor]
) -> None:
    # SIGSTOP at step 3: its sockets stay open, so the step's collective waits --timeout;
    # then its heartbeat has lapsed (the whole process is stopped): dropped at once, not
    # waited for as a live one would be, and ended by the new rank 0 (a SIGKILL reaches
    # a stopped process), so the job ends
    job, out = _survived(tmp_path / "stop", "stop:rank=2:step=3")
    assert "rank(s) 2 lost at step 3" in job.stderr, job.stderr
    assert "rank 2: worker lost (killed by SIGKILL)" in job.stderr, job.stderr
    change = _check_run(out, reference, lost=[2])
    assert change["why"]["2"].startswith("its heartbeat lapsed"), change
    assert change["waited_out_window"] is False, change
    _nothing_left(job, out)


@pytest.mark.timeout(420)
def test_below_min_workers_the_job_ends_naming_the_lost_ranks(tmp_path: Path) -> None:
    out = tmp_path / "below"
    job = _Job([*SHRINK, "--inject-fault", "kill:rank=1+2:step=3", "--out", str(out)])
    code, _ = job.wait(limit=240)
    assert code == 1, job.stderr
    last = job.stderr.strip().splitlines()[-1]
    assert "lost rank(s) 1, 2 at step 3" in last, job.stderr
    assert "1 worker(s) left, fewer than --min-workers 2" in last, job.stderr
    _nothing_left(job, out)


def _agree(late: int, window: float) -> tuple[list[int], float] | str:
    """Every rank but ``late`` answers at once; ``late``, which never heartbeats (none of
    them does here), answers after the heartbeat timeout ``window``: dropped, then refused."""
    import torch.distributed as dist

    from disttrain.comm import world
    from disttrain.comm.errors import LeftOut
    from disttrain.comm.membership import Membership

    me = world.rank()
    members = Membership(world.job_store(), me, world.size(), window, window)
    # every rank done connecting first: gloo fails a peer still meshing with a closed one
    torch.distributed.barrier()
    world.leave_group()
    if me == late:
        time.sleep(window + 1.0)
        try:
            members.agree()
        except LeftOut as exc:
            return str(exc)
        return "not left out"
    change = members.agree()
    # the survivors form their group on the agreed prefix and sum over it
    new = world.rejoin(members.rank, len(change.members), members.group_prefix())
    one = torch.ones(1)
    dist.all_reduce(one)
    return change.lost, float(one) + 10 * new.rank


@pytest.mark.timeout(120)
def test_survivors_agree_and_a_late_answer_is_left_out() -> None:
    results = run_world(_agree, 3, args=(1, 1.0), timeout=90)
    assert results[0] == ([1], 2.0)  # rank 0 of two, and the sum over two workers
    assert results[2] == ([1], 12.0)  # launch rank 2 is rank 1 of the new group
    assert isinstance(results[1], str) and "dropped from the job" in results[1]
    assert "no heartbeat from it" in results[1], results[1]


def _two_changes(window: float) -> tuple[list[int], list[int], float] | None:
    """Launch rank 3 never answers; launch rank 1 answers the first change, not the second."""
    import torch.distributed as dist

    from disttrain.comm import world
    from disttrain.comm.membership import Membership

    me = world.rank()
    members = Membership(world.job_store(), me, world.size(), window, window)
    # every rank done connecting first: gloo fails a peer still meshing with a closed one
    torch.distributed.barrier()
    world.leave_group()
    if me == 3:
        return None
    first = members.agree()
    world.rejoin(members.rank, len(first.members), members.group_prefix())
    torch.distributed.barrier()  # the same: all connected before one leaves (and shuts down)
    if me == 1:
        return None
    world.leave_group()
    second = members.agree()
    new = world.rejoin(members.rank, len(second.members), members.group_prefix())
    one = torch.ones(1) * (me + 1)  # launch ranks 0 and 2: 1 + 3
    dist.all_reduce(one)
    return first.lost, second.lost, float(one) + 10 * new.rank


@pytest.mark.timeout(120)
def test_a_second_change_builds_on_the_first() -> None:
    results = run_world(_two_changes, 4, args=(1.0,), timeout=90)
    assert results[0] == ([3], [1], 4.0)
    assert results[2] == ([3], [1], 14.0)  # rank 1 of the second group


def _uneven(window: float) -> list[torch.Tensor] | None:
    """Launch rank 1 completed one step more than rank 0 when rank 2 was lost: both end with
    rank 1's state, and rank 1's metrics line for the step rank 0 did not finish."""
    from disttrain.comm import world
    from disttrain.comm.membership import Membership
    from disttrain.train.shrink import even_out

    me = world.rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    done = 2 + (me == 1)
    for i in range(done):
        opt.zero_grad()
        model(torch.full((3, 4), float(i + 1))).pow(2).sum().backward()
        opt.step()
    members = Membership(world.job_store(), me, world.size(), window, window)
    # every rank done connecting first: gloo fails a peer still meshing with a closed one
    torch.distributed.barrier()
    world.leave_group()
    if me == 2:
        return None
    change = members.agree(done=done)
    world.rejoin(members.rank, len(change.members), members.group_prefix())
    # each hands its last metrics.jsonl line: launch rank 0 lacks step 3's, rank 1 ran it
    line = {"step": done, "loss": float(done) + 0.5 * me}
    assert even_out(change, members, model, opt, None, line) == (3, {"step": 3, "loss": 3.5})
    buffers = [opt.state[p]["momentum_buffer"] for p in model.parameters()]
    return [t.detach().clone() for t in [*model.parameters(), *buffers]]


@pytest.mark.timeout(120)
def test_survivors_at_different_steps_take_the_state_of_the_one_furthest_on() -> None:
    first, second, _ = run_world(_uneven, 3, args=(1.0,), timeout=90)
    assert first is not None and second is not None
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))  # bit for bit
