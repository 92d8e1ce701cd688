"""Resuming a checkpoint on another number of workers: equal to one process on the same batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from disttrain import checkpoint
from disttrain.collectives.chunks import chunk_bounds
from disttrain.strategies import STRATEGIES
from disttrain.strategies.capabilities import Reshards
from disttrain.strategies.state import average_states
from tests.test_cli import run_cli

#: 20 steps of the small MLP at global batch 48 (divisible by 4, 3, 2 and 1 workers)
FLAGS = (
    "--model",
    "mlp",
    "--max-steps",
    "20",
    "--batch-size",
    "48",
    "--no-progress",
    "--timeout",
    "20",
    "--lr",
    "0.05",
)


def _params(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "model.pt", weights_only=True)  # type: ignore[no-any-return]


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """One process for 20 steps: the parameters every resume on another count must equal
    (one run for the allreduce, ps and zero tests, which share an xdist group: it is
    deterministic)."""
    one = tmp_path_factory.mktemp("reshard") / "one"
    done = run_cli("train", *FLAGS, "--workers", "1", "--out", str(one))
    assert done.returncode == 0, done.stderr[-2000:]
    return _params(one)


def _killed_at_12(tmp: Path, name: str, *flags: str) -> Path:
    """A run of ``flags`` to step 20, checkpointed every 10 steps and killed at step 12."""
    out = tmp / name
    crash = run_cli(
        "train",
        *FLAGS,
        *flags,
        "--checkpoint-every",
        "10",
        "--inject-fault",
        "kill:rank=1:step=12",
        "--out",
        str(out),
    )
    assert crash.returncode == 1 and checkpoint.latest(str(out)) == 10, crash.stderr[-2000:]
    return out


#: the tests that compare with `reference`, in one xdist worker: one reference run
REFERENCE = pytest.mark.xdist_group("reshard-reference")


@REFERENCE
@pytest.mark.timeout(600)  # four short runs of up to 4 processes (+ the shared reference)
def test_allreduce_and_ps_resumed_on_another_worker_count_equal_one_process(
    reference: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    """4 workers to step 10, 2 workers from there to 20 == 1 process for 20 steps (1e-5).

    The sampler's global batch t is the same for any worker count and a synchronous
    average of B/N-sample gradients is the B-sample gradient, so only float summation
    order differs. The parameter server (sync) is the same SGD: 2 workers + 1 server to
    step 10, 1 worker from there, its server restoring its shard and optimizer by shard.
    """

    killed = _killed_at_12(tmp_path, "ar4", "--workers", "4")
    resumed = tmp_path / "ar2"
    again = run_cli(
        "train", *FLAGS, "--workers", "2", "--resume", str(killed), "--out", str(resumed)
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert _max_diff(_params(resumed), reference) < 1e-5

    ps = ("--strategy", "ps", "--ps-mode", "sync")
    killed = _killed_at_12(tmp_path, "ps2", *ps, "--workers", "2")
    resumed = tmp_path / "ps1"
    again = run_cli(
        "train", *FLAGS, *ps, "--workers", "1", "--resume", str(killed), "--out", str(resumed)
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert _max_diff(_params(resumed), reference) < 1e-5


def _worker(w: float, momentum: float, public: dict[int, float] | None = None) -> dict[str, Any]:
    strategy: dict[str, Any] = {"steps": 7}
    if public is not None:
        strategy["public"] = {r: torch.full((2,), v) for r, v in public.items()}
    return {
        "model": {"w": torch.full((2,), w)},
        "optimizer": {
            "state": {0: {"momentum_buffer": torch.full((2,), momentum)}},
            "param_groups": [{"lr": 0.1, "params": [0]}],
        },
        "strategy": strategy,
        "rng": torch.tensor([1, 2], dtype=torch.uint8),
        "step": 10,
    }


@pytest.mark.parametrize("name", ["allreduce", "localsgd", "ps", "decentralized"])
def test_each_data_parallel_strategy_reshards_by_averaging_its_workers(name: str) -> None:
    """What a resume on another count keeps: the mean of the old workers' float state
    (equal replicas stay bit for bit), counters and RNG from old worker 0; the ring's
    public copies of old neighbours are dropped (the strategy rebuilds them)."""
    cls = STRATEGIES[name].runtime
    assert issubclass(cls, Reshards)
    ring = name == "decentralized"
    olds = [
        _worker(1.0 + j, 2.0 * j, {j: 5.0, (j + 1) % 3: 6.0} if ring else None) for j in range(3)
    ]
    read_log: list[int] = []

    def read(j: int) -> dict[str, Any]:
        read_log.append(j)
        return olds[j]

    state = cls.reshard(read, 3, 1, 2)
    assert sorted(read_log) == [0, 1, 2]
    assert torch.equal(state["model"]["w"], torch.full((2,), 2.0))
    assert torch.equal(state["optimizer"]["state"][0]["momentum_buffer"], torch.full((2,), 2.0))
    assert state["optimizer"]["param_groups"][0]["lr"] == 0.1 and state["step"] == 10
    assert state["strategy"]["steps"] == 7 and "public" not in state["strategy"]


def test_equal_replicas_are_kept_without_rounding() -> None:
    x = torch.rand(100) * 0.3
    assert torch.equal(average_states([{"w": x}, {"w": x.clone()}, {"w": x.clone()}])["w"], x)
    assert average_states([0.1, 0.1, 0.1]) == 0.1  # (0.1 * 3) / 3 would not be


@pytest.mark.parametrize("name", ["pipeline", "tensor", "hybrid"])
def test_model_parallel_strategies_refuse_another_layout(name: str) -> None:
    assert not issubclass(STRATEGIES[name].runtime, Reshards)


@pytest.mark.timeout(300)
def test_async_checkpoints_commit_the_state_of_their_step(tmp_path: Path) -> None:
    """--async-checkpoint: steps 5 and 10 are committed (step 10's at the end of training,
    after its background write) and step 10's model is the run's final model, bit for bit."""
    out = tmp_path / "async"
    result = run_cli(
        "train",
        "--model",
        "mlp",
        "--max-steps",
        "10",
        "--no-progress",
        "--timeout",
        "20",
        "--checkpoint-every",
        "5",
        "--async-checkpoint",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert checkpoint.runs(str(out)) == {checkpoint.run_of(str(out)): [5, 10]}
    saved = checkpoint.load(str(out), 1, 2)["model"]
    final = _params(out)
    assert saved.keys() == final.keys() and all(torch.equal(saved[k], final[k]) for k in final)


@REFERENCE
@pytest.mark.timeout(600)  # four short runs of up to 3 processes (+ the shared reference)
def test_zero_resumed_on_another_worker_count_equals_one_process(
    reference: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    """ZeRO on 3 workers to step 10, on 2 from there to 20 == 1 process for 20 steps (1e-5).

    3 workers cut the groups unevenly (the first layer's 64·2048 + 2048 elements are
    not divisible by 3); the resume re-cuts each group's shards, and the momentum
    buffers with them, for 2. Stage 3 (parameters sharded, only buffers in the model
    entry) and stage 1 (full replicas in the model entry, optimizer state sharded).
    """
    for stage in ("3", "1"):
        zero = ("--strategy", "zero", "--zero-stage", stage)
        killed = _killed_at_12(tmp_path, f"zero{stage}-3", *zero, "--workers", "3")
        resumed = tmp_path / f"zero{stage}-2"
        again = run_cli(
            "train", *FLAGS, *zero, "--workers", "2", "--resume", str(killed), "--out", str(resumed)
        )
        assert again.returncode == 0, again.stderr[-2000:]
        assert _max_diff(_params(resumed), reference) < 1e-5, stage


def _zero_worker(j: int, full: torch.Tensor, momentum: torch.Tensor, n: int) -> dict[str, Any]:
    """Old worker j of n (ZeRO, one group): its chunk of ``full`` and of its momentum."""
    start, stop = chunk_bounds(full.numel(), n)[j]
    return {
        "model": {"b": torch.full((2,), 1.0 + j)},
        "optimizer": {
            "state": {
                0: {"momentum_buffer": momentum[start:stop].clone(), "step": torch.tensor(7.0)}
            },
            "param_groups": [{"lr": 0.1, "params": [0]}],
        },
        "strategy": {
            "stage": 3,
            "world_size": n,
            "group_numels": [full.numel()],
            "shards": [full[start:stop].clone()],
        },
        "rng": torch.tensor([1, 2], dtype=torch.uint8),
        "step": 10,
    }


@pytest.mark.parametrize(("old", "new"), [(3, 2), (2, 3), (4, 1), (5, 4)])
def test_zero_reshard_recuts_the_shards_and_the_optimizer_state(old: int, new: int) -> None:
    """Every new rank gets exactly its balanced chunk of the whole (uneven: 7 elements),
    of the parameters and of the elementwise optimizer state; the scalar step and the
    replicated rest (the model entry) as the other data-parallel strategies keep them."""
    full, momentum = torch.arange(7.0), torch.arange(7.0) * -2
    olds = [_zero_worker(j, full, momentum, old) for j in range(old)]
    for rank in range(new):
        state = STRATEGIES["zero"].runtime.reshard(lambda j: olds[j], old, rank, new)
        start, stop = chunk_bounds(7, new)[rank]
        assert torch.equal(state["strategy"]["shards"][0], full[start:stop])
        assert state["strategy"]["world_size"] == new
        entry = state["optimizer"]["state"][0]
        assert torch.equal(entry["momentum_buffer"], momentum[start:stop])
        assert float(entry["step"]) == 7.0 and state["step"] == 10
        assert torch.equal(state["model"]["b"], torch.full((2,), 1.0 + (old - 1) / 2))
