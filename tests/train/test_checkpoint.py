"""Checkpoints: atomic and committed, refused when foreign, and resumed bit for bit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from disttrain import checkpoint
from disttrain.comm.errors import UsageError
from tests.test_cli import run_cli


def _state(value: float) -> dict[str, object]:
    return {"model": {"w": torch.full((3,), value)}, "rng": torch.get_rng_state()}


def test_only_committed_steps_count_and_old_ones_are_pruned(tmp_path: Path) -> None:
    root = str(tmp_path)
    for step in (2, 4, 6):
        for rank in (0, 1):
            checkpoint.save(root, step, rank, 2, _state(step))
        checkpoint.commit(root, step, keep=2)
    checkpoint.save(root, 8, 0, 2, _state(8))  # a crash before rank 1 saved and the commit
    assert checkpoint.latest(root) == 6
    # step 8's partial save stays in its staging folder, which is no step folder
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        ".step-00000008..tmp",
        "step-00000004",
        "step-00000006",
    ]
    state = checkpoint.load(root, 1, 2)
    assert state["step"] == 6 and torch.equal(state["model"]["w"], torch.full((3,), 6.0))
    # a step folder whose COMMIT is gone (a copy cut short, a hand-made folder) is no commit
    (tmp_path / "checkpoints" / "step-00000006" / "COMMIT").unlink()
    assert checkpoint.latest(root) == 4


def test_a_file_that_is_not_ours_is_refused(tmp_path: Path) -> None:
    root = str(tmp_path)
    checkpoint.save(root, 1, 0, 1, _state(1))
    checkpoint.commit(root, 1)
    part = Path(checkpoint.step_dir(root, 1)) / "rank-00000"
    header = part / "state.json"
    doc = json.loads(header.read_text())
    header.write_text(json.dumps({**doc, "format": "something-else"}))  # not our tag
    with pytest.raises(UsageError, match="no disttrain-checkpoint-v2-dcp tag"):
        checkpoint.load(root, 0, 1)
    header.write_text(json.dumps(doc))
    (part / ".metadata").write_bytes(b"garbage")
    with pytest.raises(UsageError, match="not a disttrain checkpoint"):
        checkpoint.load(root, 0, 1)


class _Exploit:
    """A pickle that runs code when unpickled (what a plain ``pickle.load`` would do)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return (os.mkdir, (self.path,))


def test_the_dcp_index_is_read_without_running_its_pickled_code(tmp_path: Path) -> None:
    import pickle

    root = str(tmp_path / "run")
    checkpoint.save(root, 1, 0, 1, _state(1))
    checkpoint.commit(root, 1)
    meta = Path(checkpoint.step_dir(root, 1)) / "rank-00000" / ".metadata"
    meta.write_bytes(pickle.dumps(_Exploit(str(tmp_path / "pwned"))))
    with pytest.raises(UsageError, match=r"refused global posix\.mkdir"):
        checkpoint.load(root, 0, 1)
    assert not (tmp_path / "pwned").exists()
    pickle.loads(meta.read_bytes())  # the refusal mattered: DCP's own reader would run it
    assert (tmp_path / "pwned").is_dir()


def test_a_background_save_holds_the_state_of_its_step(tmp_path: Path) -> None:
    """--async-checkpoint: the save copies the tensors at once; training may then change them."""
    root, w = str(tmp_path), torch.zeros(1000)
    wait = checkpoint.save(root, 5, 0, 1, {"model": {"w": w}}, background=True)
    w.add_(1.0)  # the next optimizer step, while the write goes on
    wait()
    checkpoint.commit(root, 5)
    assert torch.equal(checkpoint.load(root, 0, 1)["model"]["w"], torch.zeros(1000))


def test_another_number_of_workers_is_refused_or_resharded(tmp_path: Path) -> None:
    for rank in (0, 1):
        checkpoint.save(str(tmp_path), 3, rank, 2, _state(rank))
    checkpoint.commit(str(tmp_path), 3)
    assert checkpoint.saved_world(str(tmp_path)) == 2
    with pytest.raises(UsageError, match="resume with --workers 2"):
        checkpoint.load(str(tmp_path), 0, 4)
    # restore: refused without a reshard, else the strategy's reshard reads the old parts
    with pytest.raises(UsageError, match="cannot change its layout: resume with --workers 2"):
        checkpoint.restore(str(tmp_path), 0, 4, None)
    seen: list[int] = []

    def reshard(read: Any, old: int, rank: int, world: int) -> dict[str, object]:
        assert (old, rank, world) == (2, 3, 4)
        seen.extend(int(read(j)["model"]["w"][0]) for j in range(old))
        return {"rank": rank}

    assert checkpoint.restore(str(tmp_path), 3, 4, reshard) == {"rank": 3}
    assert seen == [0, 1]
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no complete checkpoint"):
        checkpoint.load(str(tmp_path / "empty"), 0, 2)


def _losses(out: Path) -> list[float]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in lines if "loss" in r]


def _params(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "model.pt", weights_only=True)  # type: ignore[no-any-return]


COMMON = ("--model", "cnn", "--max-steps", "12", "--no-progress", "--timeout", "20")


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted COMMON run, which the kill + resume and the restart tests match
    (one run for both: it is deterministic, and neither test changes its folder)."""
    out = tmp_path_factory.mktemp("cnn") / "full"
    done = run_cli("train", *COMMON, "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out


@pytest.mark.xdist_group("checkpoint-cnn-full")  # with the elastic restart: one `full` run
@pytest.mark.timeout(600)  # three short training runs (and the shared uninterrupted one)
def test_killed_and_resumed_equals_uninterrupted_bit_for_bit(full: Path, tmp_path: Path) -> None:
    killed, resumed = tmp_path / "killed", tmp_path / "resumed"
    crash = run_cli(
        "train",
        *COMMON,
        "--checkpoint-every",
        "6",
        "--inject-fault",
        "kill:rank=1:step=8",
        "--out",
        str(killed),
    )
    assert crash.returncode == 1 and checkpoint.latest(str(killed)) == 6
    # the replicas' parameters and momentum were written once: half by each worker
    step6 = Path(checkpoint.step_dir(str(killed), 6))
    cut = [
        json.loads((step6 / f"rank-0000{r}" / "state.json").read_text())["shared"] for r in (0, 1)
    ]
    assert [c["index"] for c in cut] == [0, 1] and cut[0]["lengths"] == cut[1]["lengths"]
    params = sum(t.numel() for t in _params(full).values())  # the cnn has no buffers
    assert cut[0]["lengths"] == {"shared:float32": 2 * params}
    again = run_cli("train", *COMMON, "--resume", str(killed), "--out", str(resumed))
    assert again.returncode == 0, again.stderr
    run = json.loads((resumed / "summary.json").read_text())["run_id"]
    assert f"disttrain: resumed from step 6 of run {run}\n" in again.stderr, again.stderr
    a, b = _params(full), _params(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _losses(resumed) == _losses(full)[6:]
    # (another worker count: tests/train/test_checkpoint_reshard.py, refusals test_bad_inputs)


#: synchronous strategies besides allreduce, each with the state a resume must restore:
#: localsgd its replicas between averages and its period clock (checkpoint at 6, H = 4),
#: pipeline each stage's own part (interleaved: each rank's two chunks), ps sync the servers'
#: shards and optimizer state.
RESUMED = {
    "localsgd": ("--strategy", "localsgd", "--period", "4"),
    # diloco: the last-synced weights and the outer momentum (checkpoint at 6, H = 4);
    # streamed, a fragment's sum in flight at the checkpoint too (F = 2: syncs at 2, 4, 6, ...)
    "diloco": ("--strategy", "diloco", "--period", "4"),
    "diloco-streaming": ("--strategy", "diloco", "--period", "4", "--fragments", "2"),
    # allreduce + PowerSGD: its warm-start Q and error-feedback residual
    "powersgd": ("--compression", "powersgd:2", "--powersgd-start-step", "2"),
    "pipeline": ("--strategy", "pipeline", "--microbatches", "2"),
    "pipeline-interleaved": (
        "--strategy",
        "pipeline",
        "--schedule",
        "interleaved",
        "--microbatches",
        "2",
    ),
    "ps-sync": ("--strategy", "ps", "--ps-mode", "sync"),
}
#: 10 steps: the step-6 checkpoint is the only one (the trainer saves at multiples of
#: --checkpoint-every), and the 4 resumed steps reach what it must carry over: localsgd's
#: and diloco's average at step 8 (H = 4; then finish()'s at 10, so a clock counted from
#: the resume, which would average at 10 alone, differs), streaming diloco's fragment in
#: flight since step 6, PowerSGD's Q and residual, the pipeline's and servers' parts
TINY = ("--model", "mlp", "--max-steps", "10", "--no-progress", "--timeout", "20")


def _only_step(out: Path, step: int, into: Path) -> Path:
    """A copy of run ``out`` whose checkpoints stop at ``step`` (as if it died after it)."""
    shutil.copytree(out, into)
    for folder in (into / "checkpoints").iterdir():
        if folder.name.startswith("step-") and int(folder.name[5:]) > step:
            shutil.rmtree(folder)
    assert checkpoint.latest(str(into)) == step
    return into


@pytest.mark.timeout(600)  # two short training runs
@pytest.mark.parametrize("strategy", list(RESUMED))
def test_resume_is_bit_identical_for_each_synchronous_strategy(
    strategy: str, tmp_path: Path
) -> None:
    """Resumed from the run's own step-6 checkpoint, the run ends as it did. (A checkpoint
    left by a crash resumes as well: test_killed_and_resumed_equals_uninterrupted_bit_for_bit
    and the elastic restart below.)"""
    flags = (*RESUMED[strategy], *TINY)
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    done = run_cli("train", *flags, "--checkpoint-every", "6", "--out", str(full))
    assert done.returncode == 0, done.stderr
    cut = _only_step(full, 6, tmp_path / "cut")
    again = run_cli("train", *flags, "--resume", str(cut), "--out", str(resumed))
    assert again.returncode == 0, again.stderr
    a, b = _params(full), _params(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _losses(resumed) == _losses(full)[6:]


def test_an_asynchronous_parameter_server_refuses_checkpoints(tmp_path: Path) -> None:
    result = run_cli(
        "train",
        "--strategy",
        "ps",
        "--ps-mode",
        "async",
        "--checkpoint-every",
        "2",
        "--out",
        str(tmp_path / "o"),
        timeout=120,
    )
    assert result.returncode == 2
    assert "need --ps-mode sync" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.xdist_group("checkpoint-cnn-full")
@pytest.mark.timeout(600)
def test_an_elastic_restart_resumes_from_the_last_checkpoint(full: Path, tmp_path: Path) -> None:
    restarted = tmp_path / "restarted"
    result = run_cli(
        "train",
        *COMMON,
        "--checkpoint-every",
        "6",
        "--max-restarts",
        "1",
        "--inject-fault",
        "kill:rank=1:step=8",
        "--out",
        str(restarted),
    )
    assert result.returncode == 0, result.stderr
    a, b = _params(full), _params(restarted)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # steps 7 and 8 ran twice (before the kill and after the restart): 8 + 6 lines
    assert _losses(restarted)[-6:] == _losses(full)[6:]
