"""Synchronous data parallelism equals one process: 1, 2 and 4 workers at the same global batch.

Tolerance: max |difference| <= 1e-5 over all parameters after 20 steps. The
only difference between the runs is the order of floating-point sums (the
allreduce adds per-worker means), so agreement is far tighter in practice.
"""

from __future__ import annotations

import pytest
import torch

from disttrain.data import load_dataset
from disttrain.models import build_model
from tests.harness import SharedWorlds

# one xdist worker runs the module: the fixture's worlds once, not once for each model
pytestmark = pytest.mark.xdist_group("train-equivalence")


def _train(model: str, out: str, steps: int) -> dict[str, torch.Tensor] | None:
    import torch.distributed as dist

    from disttrain import config
    from disttrain.train.trainer import train

    cfg = config.load(
        {
            "model": model,
            "max_steps": steps,
            "epochs": 1,
            "out": out,
            "progress": False,
            "batch_size": 64,
            "seed": 7,
            "workers": dist.get_world_size(),
        }
    )
    train(cfg)
    if dist.get_rank() == 0:
        return torch.load(f"{out}/model.pt", weights_only=True)  # type: ignore[no-any-return]
    return None


MODELS = ("mlp", "cnn")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> SharedWorlds:
    """Both models' runs on 1, 2 and 4 workers: one world per size (3 spawns, not 6)."""
    tmp = tmp_path_factory.mktemp("equivalence")
    jobs = {
        f"{m} {n}": (n, _train, (m, str(tmp / f"{m}-w{n}"), 20)) for m in MODELS for n in (1, 2, 4)
    }
    return SharedWorlds(jobs, timeout=550)


@pytest.mark.timeout(600)  # 3 worlds of up to 4 processes on 2 cores, both models in each
@pytest.mark.parametrize("model", MODELS)
def test_parameters_after_20_steps_match_for_1_2_and_4_workers(
    model: str, runs: SharedWorlds
) -> None:
    results = {n: runs.get(f"{model} {n}")[0] for n in (1, 2, 4)}
    reference = results[1]
    assert reference is not None
    for n in (2, 4):
        other = results[n]
        assert other is not None and other.keys() == reference.keys()
        worst = max(float((other[k] - reference[k]).abs().max()) for k in reference)
        assert worst <= 1e-5, f"{n} workers differ from 1 by {worst:.2e}"
    # and training moved the parameters at all (the comparison is not vacuous)
    torch.manual_seed(7)
    start = build_model(model, load_dataset("digits")).state_dict()
    moved = max(float((start[k] - reference[k]).abs().max()) for k in reference)
    assert moved > 1e-3
