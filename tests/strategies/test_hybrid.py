"""The mesh (dp x pp, dp x tp) equals the unsplit model at the same global batch after 10 steps."""

from __future__ import annotations

from typing import Any

import pytest

from disttrain.comm.errors import UsageError
from tests.harness import SharedWorlds
from tests.parallel import reference as ref


def _run(inner: str) -> dict[str, Any]:
    import torch.distributed as dist

    from disttrain.comm import world
    from disttrain.strategies.hybrid import Hybrid
    from disttrain.train.trainer import loss_fn

    data = ref.batches(16)
    want, want_losses = ref.reference(ref.model(), data)
    schedules = {"pp": "1f1b", "pp-zb1": "zb1", "pp-interleaved": "interleaved"}
    pp = inner.startswith("pp")
    flags = {"pp": 2, "schedule": schedules[inner], "microbatches": 2} if pp else {"tp": 2}
    cfg = ref.config(workers=4, strategy="hybrid", batch_size=16, dp=2, **flags)
    strategy = Hybrid(cfg, world.current(), loss_fn)
    d, n = strategy.data_rank, strategy.data_world_size
    shards = [(x.chunk(n)[d], y.chunk(n)[d]) for x, y in data]  # the trainer's sampler does this
    _, losses = ref.train(strategy, ref.model(), shards)
    worst = 0.0
    if pp:  # tensor shards are checked against the reference in test_tensor
        chunks = strategy.inner.runner.chunks  # type: ignore[union-attr]
        for name, p in (np for chunk in chunks for np in chunk.named_parameters()):
            w = want.get_parameter(name)
            assert p.grad is not None and w.grad is not None
            worst = max(worst, (p - w).abs().max().item(), (p.grad - w.grad).abs().max().item())
    whole = strategy.eval_model()
    if whole is not None:
        for name, p in whole.named_parameters():
            worst = max(worst, (p - want.get_parameter(name)).abs().max().item())
        worst = max(worst, max(abs(a - b) for a, b in zip(losses, want_losses, strict=True)))
    return {"worst": worst, "whole": whole is not None, "rank": dist.get_rank(), "d": d}


INNER = ("pp", "tp", "pp-zb1", "pp-interleaved")
#: every mesh in one world of 4 ranks (1 spawn instead of 4: a spawn's start-up costs more
#: than a run; each builds its own model, strategy and groups)
RUNS = SharedWorlds({inner: (4, _run, (inner,)) for inner in INNER}, timeout=400)


@pytest.mark.timeout(450)  # the first case runs the shared world
@pytest.mark.parametrize("inner", INNER)
def test_mesh_equals_the_unsplit_model(inner: str) -> None:
    results = RUNS.get(inner)
    assert [r["whole"] for r in results] == [True, False, False, False]
    assert [r["d"] for r in results] == [0, 0, 1, 1]
    for r in results:
        assert r["worst"] < ref.TOL, r


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        ({"dp": 3, "pp": 2}, r"--dp 3 x --pp 2 = 6 ranks, but there are 4 workers"),
        ({"dp": 2, "pp": 2, "microbatches": 3}, "--microbatches 3 does not divide the batch of 8"),
        ({"dp": 2}, "needs --pp P or --tp T"),
        ({"dp": 1, "pp": 9, "workers": 9}, "--pp 9 is more than the model's 8 layers"),
    ],
)
def test_bad_mesh_names_the_number_to_change(flags: dict[str, Any], match: str) -> None:
    from disttrain.strategies.hybrid import HybridSettings

    flags = {"workers": 4, **flags}
    cfg = ref.config(strategy="hybrid", batch_size=36 if flags["workers"] == 9 else 16, **flags)
    with pytest.raises(UsageError, match=match):
        HybridSettings.validate_config(cfg, ref.model())
