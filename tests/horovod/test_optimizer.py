"""DistributedOptimizer and the broadcasts, on 2 ranks, against one process on the whole batch;
and init's life cycle (shutdown then init again) in the same world."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from disttrain.launch.spawn import run_world

STEPS, BATCH = 3, 8


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2), nn.Linear(2, 2))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, BATCH, 4, generator=g), torch.randn(STEPS, BATCH, 2, generator=g)


def _reference() -> list[torch.Tensor]:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    xs, ys = _data()
    for x, y in zip(xs, ys, strict=True):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _train(compression: str, passes: int, fusion: str | None) -> dict[str, Any]:
    import os

    import disttrain.horovod as hvd
    from disttrain.comm import world

    if fusion is not None:  # read when the optimizer is made
        os.environ["HOROVOD_FUSION_THRESHOLD"] = fusion

    world.shutdown()  # init joins the world itself (and leaves it at shutdown)
    hvd.init()
    hvd.shutdown()
    hvd.init()  # again, in the same process: a fresh group
    r, n = hvd.rank(), hvd.size()
    model = _model()
    if r == 1:  # a different start: broadcast_parameters must fix it
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(
        opt,
        named_parameters=model.named_parameters(),
        compression=getattr(hvd.Compression, compression),
        backward_passes_per_step=passes,
    )
    xs, ys = _data()
    launches = []
    for x, y in zip(xs, ys, strict=True):
        opt.zero_grad()
        mine = x.chunk(n)[r], y.chunk(n)[r]
        for xp, yp in zip(mine[0].chunk(passes), mine[1].chunk(passes), strict=True):
            # the mean over the whole batch: each pass's share of it
            (nn.functional.mse_loss(model(xp), yp) / passes).backward()
        launches.append(len(opt._launched))  # type: ignore[attr-defined]  # all, in backward
        opt.step()
    out = {
        "params": [p.detach().clone() for p in model.parameters()],
        "is_sgd": isinstance(opt, torch.optim.SGD),
        "launches": launches,
    }
    with pytest.raises(AssertionError):
        nn.functional.mse_loss(model(xs[0]), ys[0]).backward()
        opt.zero_grad()  # after backward, before step: Horovod refuses
    opt.synchronize()
    with pytest.warns(UserWarning, match="skip_synchronize"):
        opt.step()
    out["flags"] = (hvd.gloo_built(), hvd.mpi_built(), hvd.nccl_built(), hvd.is_initialized())
    hvd.shutdown()
    out["after"] = hvd.is_initialized()
    return out


# HOROVOD_FUSION_THRESHOLD -> allreduces per step. The gradients in launch order (reverse
# registration) have 8, 16, 8, 64, 32 and 128 bytes: at 100 bytes, the first four share a
# buffer, 32 goes alone (with 128 it would pass 100), and 128 alone; 0 is one per parameter
FUSION = {None: 1, "100": 3, "0": 6}


@pytest.mark.parametrize(
    ("compression", "passes", "tol", "fusion"),
    [
        ("none", 1, 1e-6, None),
        ("none", 2, 1e-6, None),
        ("fp16", 1, 5e-3, None),
        ("none", 1, 1e-6, "100"),
        ("fp16", 2, 5e-3, "0"),
    ],
)
def test_training_equals_one_process_on_the_whole_batch(
    compression: str, passes: int, tol: float, fusion: str | None
) -> None:
    expected = _reference()
    results = run_world(_train, world_size=2, args=(compression, passes, fusion), timeout=120)
    for got in results:
        assert got["launches"] == [FUSION[fusion]] * STEPS
        assert got["is_sgd"]
        assert got["flags"] == (True, False, 0, True)
        assert got["after"] is False
        for p, q in zip(got["params"], expected, strict=True):
            torch.testing.assert_close(p, q, atol=tol, rtol=tol)


# --- op=hvd.Adasum: Adasum of each rank's update (Horovod's _DistributedAdasumOptimizer) ---
ADASUM_RUNS = {"sgd_momentum": 1, "adam_two_passes": 2}  # optimizer -> backward passes


def _optimizer(kind: str, params: Any) -> torch.optim.Optimizer:
    if kind == "sgd_momentum":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.Adam(params, lr=0.05)


def _adasum_reference(kind: str, passes: int, n: int = 2) -> list[torch.Tensor]:
    """By hand, in one process: each rank's model starts the step from the shared weights,
    its own optimizer (its own state) steps on its shard; the shared weights move by the
    Adasum of the ranks' changes, per parameter tensor (the tree of test_adasum.py)."""
    from tests.collectives.test_adasum import reference

    shared = [p.detach().clone() for p in _model().parameters()]
    models = [_model() for _ in range(n)]
    opts = [_optimizer(kind, m.parameters()) for m in models]
    xs, ys = _data()
    for x, y in zip(xs, ys, strict=True):
        deltas = []
        for r, (model, opt) in enumerate(zip(models, opts, strict=True)):
            with torch.no_grad():
                for p, s in zip(model.parameters(), shared, strict=True):
                    p.copy_(s)
            opt.zero_grad()
            for xp, yp in zip(
                x.chunk(n)[r].chunk(passes), y.chunk(n)[r].chunk(passes), strict=True
            ):
                (nn.functional.mse_loss(model(xp), yp) / passes).backward()
            opt.step()
            deltas.append([p.detach() - s for p, s in zip(model.parameters(), shared, strict=True)])
        shared = [s + reference([d[i] for d in deltas]).float() for i, s in enumerate(shared)]
    return shared


def _adasum_train() -> dict[str, Any]:
    import disttrain.horovod as hvd
    from disttrain.comm import world

    world.shutdown()  # init joins the world itself
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    out: dict[str, Any] = {}
    for kind, passes in ADASUM_RUNS.items():
        model = _model()
        opt = hvd.DistributedOptimizer(
            _optimizer(kind, model.parameters()),
            named_parameters=model.named_parameters(),
            backward_passes_per_step=passes,
            op=hvd.Adasum,
        )
        xs, ys = _data()
        for x, y in zip(xs, ys, strict=True):
            opt.zero_grad()
            for xp, yp in zip(
                x.chunk(n)[r].chunk(passes), y.chunk(n)[r].chunk(passes), strict=True
            ):
                (nn.functional.mse_loss(model(xp), yp) / passes).backward()
            opt.synchronize()  # a no-op with Adasum (Horovod's too): no warning at step
            opt.step()
        out[kind] = [p.detach().clone() for p in model.parameters()]
        out[f"{kind} class"] = isinstance(opt, type(_optimizer(kind, model.parameters())))
    skip = "Skipping synchronization is not supported"
    with pytest.raises(AssertionError, match=skip), opt.skip_synchronize():
        pass
    with pytest.raises(AssertionError, match="zero_grad"):
        for _ in range(ADASUM_RUNS["adam_two_passes"]):
            nn.functional.mse_loss(model(xs[0]), ys[0]).backward()
        opt.zero_grad()  # launched, not stepped: Horovod refuses
    opt.step()
    if r == 0:  # Adasum while a rank is joined: refused (docs/horovod.md, a difference)
        hvd.join()
    else:
        with pytest.raises(hvd.HorovodInternalError, match="not supported with Join"):
            hvd.allreduce(torch.ones(2), op=hvd.Adasum)
        hvd.join()
    hvd.shutdown()
    return out


def test_adasum_optimizer_combines_each_ranks_update_as_horovod() -> None:
    """Tolerance 1e-6 (float32 weights; the by-hand Adasum is float64, then rounded)."""
    results = run_world(_adasum_train, world_size=2, timeout=120)
    for kind, passes in ADASUM_RUNS.items():
        expected = _adasum_reference(kind, passes)
        for got in results:
            assert got[f"{kind} class"]
            for p, q in zip(got[kind], expected, strict=True):
                torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-6)
