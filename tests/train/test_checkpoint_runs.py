"""Checkpoints belong to one run: refused in a foreign --out, filtered, never rewritten in place."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from disttrain import checkpoint
from disttrain.checkpoint import dcp
from disttrain.comm.errors import UsageError
from disttrain.comm.world import World
from tests.test_cli import run_cli

A, B = "a" * 32, "b" * 32
RUN_ENV = "DISTTRAIN_RUN_ID"  # how the launcher hands the run id to every process


def _state(value: float) -> dict[str, object]:
    return {"model": {"w": torch.full((3,), value)}}


def _commit(root: str, run: str, *steps: int, world: int = 2) -> None:
    for step in steps:
        for rank in range(world):
            checkpoint.save(root, step, rank, world, _state(float(step)), run=run)
        checkpoint.commit(root, step, run=run)


def _commit_as(mp: pytest.MonkeyPatch, root: str, run: str, *steps: int) -> None:
    """Commit ``steps`` as the processes of run ``run`` do: the id from the environment."""
    mp.setenv(RUN_ENV, run)
    for step in steps:
        for rank in (0, 1):
            checkpoint.save(root, step, rank, 2, _state(float(step)))
        checkpoint.commit(root, step)


def _files(root: Path, step: int) -> list[dict[str, object]]:
    folder = Path(checkpoint.step_dir(str(root), step))
    return [{**h, **s} for h, s in (dcp.read(str(p)) for p in sorted(folder.glob("rank-*")))]


def test_a_run_lists_loads_and_prunes_only_its_own_steps(tmp_path: Path) -> None:
    root = str(tmp_path)
    _commit(root, A, 90, 100)
    _commit(root, B, 10, 20, 30)  # before: B's commits deleted its own 10, 20 *and* kept 90, 100
    assert checkpoint.runs(root) == {A: [90, 100], B: [20, 30]}
    assert checkpoint.latest(root, B) == 30 and checkpoint.latest(root, A) == 100
    state = checkpoint.load(root, 1, 2, run=B)
    assert state["step"] == 30 and state["run"] == B
    with pytest.raises(UsageError, match="holds the checkpoints of 2 runs"):
        checkpoint.load(root, 0, 2)  # outside a job, with two runs there: which one?


def test_a_crash_between_rank_files_leaves_no_committed_step_mixing_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(tmp_path)
    _commit_as(monkeypatch, root, A, 5, 10)

    def crash_mid_save(step: int, value: float) -> None:
        checkpoint.save(root, step, 0, 2, _state(value))
        raise RuntimeError("killed before rank 1 saved")

    # another run saves step 10 again into the same folder, and dies between the rank files
    monkeypatch.setenv(RUN_ENV, B)
    with pytest.raises(RuntimeError, match="killed"):
        crash_mid_save(10, -1.0)
    # run A, restarted from its step 10, dies between the rank files of step 15
    monkeypatch.setenv(RUN_ENV, A)
    with pytest.raises(RuntimeError, match="killed"):
        crash_mid_save(15, 15.0)

    for step in (5, 10):  # every committed step is whole and of one run: A's
        values = [f["model"]["w"].tolist() for f in _files(tmp_path, step)]  # type: ignore[index]
        assert values == [[float(step)] * 3] * 2, f"step {step} mixes two runs' files: {values}"
    assert [f.get("run") for s in (5, 10) for f in _files(tmp_path, s)] == [A] * 4
    assert checkpoint.runs(root) == {A: [5, 10]}
    for rank in (0, 1):  # resume picks the last complete step of the same run
        state = checkpoint.load(root, rank, 2)
        assert state["step"] == 10 and torch.equal(state["model"]["w"], torch.full((3,), 10.0))
    with pytest.raises(UsageError, match="no complete checkpoint"):
        checkpoint.load(root, 0, 2, run=B)


def test_commit_fsyncs_the_folders_whose_entries_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real = os.fsync

    def record(fd: int) -> None:
        synced.append(os.path.realpath(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    root = tmp_path / "out"
    _commit_as(monkeypatch, str(root), A, 7)
    base = os.path.realpath(root / "checkpoints")
    assert synced[-1] == base, "the rename of the step folder into checkpoints/ was not fsync'ed"
    assert str(root.resolve()) in synced, "the new checkpoints/ folder's entry was not fsync'ed"
    # each rank's DCP files, its state.json and its folder, and the marker, before the renames
    for rank in ("rank-00000", "rank-00001"):
        names = {os.path.basename(p) for p in synced if f"/{rank}" in p}
        assert {rank, "state.json", ".metadata", "__0_0.distcp"} <= names, synced
    assert any(os.path.basename(p).startswith("COMMIT") for p in synced), synced
    assert sorted(os.listdir(checkpoint.step_dir(str(root), 7))) == [
        "COMMIT",
        "rank-00000",
        "rank-00001",
    ]


def test_commit_never_replaces_a_committed_step(tmp_path: Path) -> None:
    _commit(str(tmp_path), A, 4)
    checkpoint.save(str(tmp_path), 4, 0, 1, _state(0.0), run=B)
    with pytest.raises(FileExistsError, match="already committed"):
        checkpoint.commit(str(tmp_path), 4, run=B)
    assert [f["run"] for f in _files(tmp_path, 4)] == [A, A]


def test_claim_refuses_a_folder_with_other_checkpoints_unless_overwrite(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    _commit(out, A, 90, 100)
    with pytest.raises(UsageError) as refused:
        checkpoint.claim(out)
    line = str(refused.value)
    assert "\n" not in line and f"--resume {out}" in line and "--overwrite" in line
    assert checkpoint.claim(out, resume=out) == A  # a resume in place continues run A
    assert checkpoint.runs(out) == {A: [90, 100]}
    other = str(tmp_path / "other")
    _commit(other, B, 1)
    with pytest.raises(UsageError, match="already holds checkpoints"):
        checkpoint.claim(other, resume=out)  # resuming A into a folder that holds B's
    assert checkpoint.claim(out, restarted=True) == A  # torchrun's restart keeps its run
    fresh = checkpoint.claim(out, overwrite=True)
    assert fresh not in (A, "") and checkpoint.runs(out) == {}


def test_a_restart_after_a_resume_continues_from_its_own_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    earlier, out = str(tmp_path / "earlier"), str(tmp_path / "out")
    _commit_as(monkeypatch, earlier, A, 6)
    _commit_as(monkeypatch, out, A, 12)  # the resumed run got to step 12 before it failed
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert checkpoint.resume_source(earlier, out) == out
    monkeypatch.setenv(RUN_ENV, B)  # none of this run's own: back to --resume
    assert checkpoint.resume_source(earlier, out) == earlier


def test_under_torchrun_rank_0_claims_the_run_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from disttrain.train.resume import agree_run

    out = str(tmp_path / "out")
    _commit(out, A, 90, 100)
    monkeypatch.setenv(RUN_ENV, "x")
    monkeypatch.delenv(checkpoint.RUN_ENV)  # torchrun: no launcher drew an id
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    world = World(0, 1, 0, "gloo", torch.device("cpu"), 5.0)
    tc = SimpleNamespace(out=out, resume="", overwrite=False)
    with pytest.raises(UsageError, match="already holds checkpoints"):
        agree_run(tc, world)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert agree_run(tc, world) == A == os.environ[checkpoint.RUN_ENV]


FLAGS = ("--workers", "2", "--checkpoint-every", "10", "--no-progress", "--timeout", "20")


def _steps(out: Path) -> list[int]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in lines if "loss" in r]


@pytest.mark.timeout(600)  # three short training runs
def test_a_new_run_into_an_old_runs_out_is_refused_and_overwrite_restarts_from_its_own_step(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    # the old run's kept steps (20 and 30) lie past the new run's last (16), so a new run
    # that took the old run's checkpoints for its own would log past 16 or resume from 30
    older = run_cli("train", *FLAGS, "--max-steps", "30", "--out", str(out))
    assert older.returncode == 0, older.stderr
    steps = sorted(p.name for p in (out / "checkpoints").glob("step-*"))
    assert steps == ["step-00000020", "step-00000030"], steps

    refused = run_cli("train", *FLAGS, "--max-steps", "16", "--out", str(out), timeout=120)
    assert refused.returncode == 2, refused.stderr  # before: it ran, and pruned its own step 10
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert f"--resume {out}" in lines[0] and "--out" in lines[0] and "--overwrite" in lines[0]
    old_run = json.loads((out / "summary.json").read_text())["run_id"]
    assert checkpoint.runs(str(out)) == {old_run: [20, 30]}  # untouched

    new = run_cli(
        "train",
        *FLAGS,
        "--max-steps",
        "16",
        "--overwrite",
        "--max-restarts",
        "1",
        "--inject-fault",
        "kill:rank=1:step=12",
        "--out",
        str(out),
    )
    assert new.returncode == 0, new.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 16, summary["steps"]  # before: 30, the old run's last step
    assert summary["run_id"] != old_run
    # the elastic restart says where it went on from
    assert f"resumed from step 10 of run {summary['run_id']}" in new.stderr, new.stderr
    assert checkpoint.runs(str(out)) == {summary["run_id"]: [10]}
    logged = _steps(out)
    back = next(i for i in range(1, len(logged)) if logged[i] <= logged[i - 1])
    assert logged[back] == 11 and logged[-1] == 16, logged  # the restart went on from ITS step 10


def _logged_steps(out: Path) -> list[int]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in lines if "loss" in r]


@pytest.mark.timeout(240)
def test_a_resume_in_place_keeps_the_earlier_log_and_runs_the_later_steps_once(
    tmp_path: Path,
) -> None:
    """--resume DIR --out DIR "deletes nothing": metrics.jsonl keeps the first run's lines
    and goes on after them, a step run again after the checkpoint logged twice (as an
    elastic restart's log shows it)."""
    out = tmp_path / "run"
    flags = ("--model", "mlp", "--batch-size", "32", "--checkpoint-every", "2", "--no-progress")
    first = run_cli("train", *flags, "--max-steps", "5", "--out", str(out))
    assert first.returncode == 0, first.stderr[-2000:]
    assert _logged_steps(out) == [1, 2, 3, 4, 5] and checkpoint.latest(str(out)) == 4
    again = run_cli("train", *flags, "--max-steps", "7", "--resume", str(out), "--out", str(out))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resumed from step 4" in again.stderr
    assert _logged_steps(out) == [1, 2, 3, 4, 5, 5, 6, 7]


def test_a_restart_with_nothing_committed_says_it_starts_again(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from disttrain.train.resume import say_where_it_goes_on

    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    say_where_it_goes_on(0, "r" * 32)
    assert capsys.readouterr().err == (
        "disttrain: restart 1: no committed checkpoint yet, so training starts again from step 1\n"
    )
