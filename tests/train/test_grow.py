"""Live grow (``--max-workers``, ``train --join``) through the real command.

A joiner gets the job's state from group rank 0 by broadcast at a step boundary, so right
after the join every worker holds the same bits (checked by the sha256 of each worker's
model and optimizer tensors, ``DISTTRAIN_JOIN_DUMP``). The grow re-splits the same global
batches (``--batch-size`` stays the global batch) and loses or repeats no step, so the run
ends where one process trained on the same global batches ends: tolerance 1e-5 on every
parameter (only the order of float sums differs; one step's update is ~1e-3 here, so a
step lost or run twice would be seen). ``DISTTRAIN_AWAIT_JOIN=S`` makes rank 0 wait for the
joiner at S steps done (a deterministic trigger; the grow follows one step later).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from disttrain import cli
from tests import zygote
from tests.train.test_faults import REPO, _Job

COMMON = ("--batch-size", "24", "--seed", "3", "--no-progress", "--timeout", "60")


def _reference(out: Path, steps: int) -> dict[str, torch.Tensor]:
    """One process on the same global batches (forked from the zygote: torch imported once)."""
    zygote.run(
        [
            sys.executable,
            "-m",
            "disttrain",
            "train",
            "--workers",
            "1",
            *COMMON,
            "--max-steps",
            str(steps),
            "--out",
            str(out),
        ],
        cwd=REPO,
        check=True,
        timeout=240,
        stdout=subprocess.DEVNULL,
    )
    return torch.load(out / "model.pt", weights_only=True)  # type: ignore[no-any-return]


def _assert_equals_one_process(tmp_path: Path, steps: int) -> None:
    """The job's final parameters equal one process trained on the same global batches."""
    params = torch.load(tmp_path / "out" / "model.pt", weights_only=True)
    reference = _reference(tmp_path / "one", steps)
    worst = max(float((params[k] - reference[k]).abs().max()) for k in reference)
    assert worst <= 1e-5, f"differs from one process by {worst:.2e}"


def _join(out: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``disttrain train --join OUT`` once the job has left its join point."""
    deadline = time.monotonic() + 120
    while not (out / "join.json").exists():
        assert time.monotonic() < deadline, "the job left no join.json"
        time.sleep(0.1)
    return zygote.run(  # forked: a joiner starts in a fraction of a fresh interpreter's CPU
        [sys.executable, "-m", "disttrain", "train", "--join", str(out)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO / "src"), **(env or {})},
        capture_output=True,
        text=True,
        timeout=240,
    )


def _grow(
    tmp: Path, args: list[str], await_at: int, steps: int
) -> tuple[dict, list[dict], dict[str, str]]:  # type: ignore[type-arg]
    """Run the job with one joiner; its summary, metrics lines and each worker's dump."""
    out, dump = tmp / "out", tmp / "dump"
    dump.mkdir()
    os.environ["DISTTRAIN_JOIN_DUMP"] = str(dump)
    os.environ["DISTTRAIN_AWAIT_JOIN"] = str(await_at)
    try:
        job = _Job([*args, *COMMON, "--max-steps", str(steps), "--out", str(out)])
        joiner = _join(out)
        code = job.proc.wait(timeout=240)
    finally:
        del os.environ["DISTTRAIN_JOIN_DUMP"], os.environ["DISTTRAIN_AWAIT_JOIN"]
    job._reader.join(timeout=5)
    assert joiner.returncode == 0, joiner.stderr
    assert code == 0, job.stderr
    summary = json.loads((out / "summary.json").read_text())
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "loss" in r] == list(range(1, steps + 1))  # each once
    assert not (out / "join.json").exists()  # no join point left after the job
    dumps = {p.name: p.read_text() for p in dump.iterdir()}
    return summary, lines, dumps


@pytest.mark.timeout(600)
def test_a_third_worker_joins_with_the_same_bits_and_no_step_is_lost(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    args = ["--workers", "2", "--max-workers", "3", "--timeline", str(trace)]
    summary, lines, dumps = _grow(tmp_path, args, 4, 8)  # steps before and after: all it needs
    # rank 0 saw the joiner at 4 steps done: the three trained together from step 6
    (change,) = summary["membership"]
    assert {k: change[k] for k in ("step", "workers", "before", "joined")} == {
        "step": 6,
        "workers": 3,
        "before": 2,
        "joined": [2],
    }
    assert [r["joined"] for r in lines if r.get("event") == "membership"] == [[2]]
    assert summary["workers"] == 3 and summary["steps"] == 8
    events = json.loads(trace.read_text())["traceEvents"]
    marks = [(e["pid"], e["args"]["joined"]) for e in events if e["name"] == "membership change"]
    assert sorted(marks) == [(0, [2]), (1, [2]), (2, [2])], marks  # each worker's moment
    assert sorted(dumps) == ["0", "1", "2"]
    assert len(set(dumps.values())) == 1, dumps  # bit for bit, at 5 steps done
    assert next(iter(dumps.values())).startswith("5 ")
    _assert_equals_one_process(tmp_path, 8)


@pytest.mark.timeout(600)
def test_a_worker_joins_after_another_was_lost(tmp_path: Path) -> None:
    args = [
        "--workers",
        "3",
        "--min-workers",
        "2",
        "--max-workers",
        "3",
        "--inject-fault",
        "kill:rank=2:step=3",
    ]
    summary, _, dumps = _grow(tmp_path, args, 6, 10)
    left, joined = summary["membership"]
    assert (left["step"], left["lost"], left["workers"]) == (3, [2], 2)
    # the joiner's launch rank follows the job's launch ranks: 3, not the lost 2
    assert (joined["step"], joined["joined"], joined["workers"]) == (8, [3], 3)
    assert sorted(dumps) == ["0", "1", "3"] and len(set(dumps.values())) == 1, dumps
    _assert_equals_one_process(tmp_path, 10)


@pytest.mark.timeout(600)
def test_a_joiner_gone_after_its_admission_leaves_the_job_as_it_was(tmp_path: Path) -> None:
    """The members wait --timeout for it in the new group, then go on in one without it.

    --timeout 8 (the members' wait for the admitted joiner; also every collective's limit):
    a step of this job takes 0.2 s; 20 cost the suite 12 s more for
    nothing. The joiner's start-up is not bounded by it: the members wait for a ready joiner
    outside any collective, up to grow.AWAIT_LIMIT (a loaded machine took more than 8 s)."""
    out = tmp_path / "out"
    os.environ["DISTTRAIN_AWAIT_JOIN"] = "4"
    try:
        job = _Job(
            [
                "--workers",
                "2",
                "--max-workers",
                "3",
                *COMMON[:-1],
                "8",
                "--max-steps",
                "8",
                "--out",
                str(out),
            ]
        )
        joiner = _join(out, {"DISTTRAIN_JOIN_FAIL": "1"})
        code = job.proc.wait(timeout=240)
    finally:
        del os.environ["DISTTRAIN_AWAIT_JOIN"]
    job._reader.join(timeout=5)
    assert joiner.returncode == 1 and code == 0, job.stderr
    assert "rank(s) 2 admitted after step 5 did not join" in job.stderr, job.stderr
    (change,) = json.loads((out / "summary.json").read_text())["membership"]
    assert (change["joined"], change["not_joined"], change["workers"]) == ([], [2], 2)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "loss" in r] == list(range(1, 9))  # each once


def _one_line(err: str, expect: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0] and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (
            ["--strategy", "zero", "--workers", "2", "--batch-size", "60", "--max-workers", "3"],
            "--max-workers 3: only --strategy allreduce admits a joining worker",
        ),
        (
            ["--workers", "2", "--batch-size", "64", "--max-workers", "3"],
            "--batch-size 64 must split evenly over every worker count from 2 to --max-workers 3",
        ),
        (
            ["--workers", "2", "--max-workers", "2"],
            "--max-workers must exceed the 2 workers (or equal them with --min-workers), got 2",
        ),
        (
            [
                "--workers",
                "2",
                "--batch-size",
                "60",
                "--max-workers",
                "3",
                "--max-restarts",
                "1",
                "--checkpoint-every",
                "2",
            ],
            "--max-workers 3 with --max-restarts: choose one",
        ),
        (
            [
                "--workers",
                "2",
                "--batch-size",
                "60",
                "--max-workers",
                "3",
                "--compression",
                "topk:0.1",
            ],
            "--max-workers with --compression topk:0.1: a joiner has no error feedback",
        ),
        (
            ["--launcher", "slurm", "--workers", "2", "--batch-size", "60", "--max-workers", "3"],
            "--max-workers 3 needs a single-host job (--launcher local, --nnodes 1)",
        ),
    ],
    ids=[
        "max-workers-strategy",
        "max-workers-batch",
        "max-workers-count",
        "max-workers-restarts",
        "max-workers-sparse",
        "max-workers-launcher",
    ],
)
def test_a_job_that_cannot_grow_is_refused(
    argv: list[str], expect: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["train", "--no-progress", "--out", str(tmp_path), *argv]) == 2
    _one_line(capsys.readouterr().err, expect)


def test_join_without_a_job_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["train", "--join", str(tmp_path)]) == 2
    _one_line(capsys.readouterr().err, f"--join {tmp_path}: no job there admits workers")
    assert cli.main(["train", "--join", str(tmp_path), "--strategy", "zero"]) == 2
    _one_line(capsys.readouterr().err, "the job's settings from its join.json: drop --strategy")
    point = {"store": str(tmp_path / "gone.store"), "run": "r", "workers": 2, "settings": {}}
    (tmp_path / "join.json").write_text(json.dumps(point))
    assert cli.main(["train", "--join", str(tmp_path)]) == 2
    _one_line(capsys.readouterr().err, "is not running any more")


@pytest.mark.timeout(120)
def test_a_joiner_nobody_admits_names_what_it_waited_for(tmp_path: Path) -> None:
    """A join point whose job never looks (a store nobody reads): the joiner ends by itself."""
    store = tmp_path / "job.store"
    torch.distributed.FileStore(str(store), -1).set("x", "1")  # the file exists
    settings = {
        "workers": 2,
        "max_workers": 3,
        "batch_size": 24,
        "timeout": 2.0,
        "out": str(tmp_path),
    }
    point = {"store": str(store), "run": "r", "workers": 2, "settings": settings}
    (tmp_path / "join.json").write_text(json.dumps(point))
    done = subprocess.run(
        [sys.executable, "-m", "disttrain", "train", "--join", str(tmp_path)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "not admitted (no answer): waited 2 s (--timeout) for the job's rank 0" in last, last
