"""The data-parallel engine against its references: PyTorch DDP and one process at the global batch.

Every registered allreduce algorithm (whatever ``collectives.ALGORITHMS`` holds
when the test runs; all but ``native`` run on the communication thread), fusion
on and off, overlap on and off, with and without accumulation: the averaged
gradients after each of two steps must equal DDP's and the single-process
large-batch gradients within 1e-5 (absolute, on values of order 1e-2 to 1).
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import torch

from tests.harness import run_world

TOL = 1e-5
GLOBAL_BATCH = 12


def _data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(GLOBAL_BATCH, 16, generator=g)
    return x, torch.randint(0, 4, (GLOBAL_BATCH,), generator=g)


def _base_model() -> torch.nn.Module:
    from disttrain.models import mlp

    torch.manual_seed(0)
    return mlp(16, 4, hidden=(24, 20))


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def _cases(algorithms: list[str]) -> list[tuple[str, float, bool, int]]:
    """native: every combination; the others: fusion off / tiny / whole model, each way."""
    full = list(itertools.product(["native"], (0.0, 0.001, 25.0), (True, False), (1, 2)))
    mixed = [(0.0, True, 1), (0.001, False, 2), (0.001, True, 2), (25.0, True, 1)]
    return full + [(a, *case) for a in algorithms if a != "native" for case in mixed]


def _compare_all() -> list[dict[str, Any]]:
    import torch.distributed as dist
    from torch.nn import functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from disttrain import collectives, config, strategies
    from disttrain.comm import world as world_mod

    world = world_mod.current()
    n, r = world.world_size, world.rank
    shard = slice(r * GLOBAL_BATCH // n, (r + 1) * GLOBAL_BATCH // n)
    base = _base_model()

    # references: one process at the global batch, and DDP on the shard, two SGD steps each
    single, ddp_model = copy.deepcopy(base), DDP(copy.deepcopy(base))
    ref_grads: list[list[torch.Tensor]] = []
    ddp_grads: list[list[torch.Tensor]] = []
    opt_s = torch.optim.SGD(single.parameters(), lr=0.1, momentum=0.9)
    opt_d = torch.optim.SGD(ddp_model.parameters(), lr=0.1, momentum=0.9)
    for step in range(2):
        x, y = _data(step)
        opt_s.zero_grad()
        F.cross_entropy(single(x), y).backward()
        ref_grads.append([p.grad.clone() for p in single.parameters()])
        opt_s.step()
        opt_d.zero_grad()
        F.cross_entropy(ddp_model(x[shard]), y[shard]).backward()
        ddp_grads.append([p.grad.clone() for p in ddp_model.parameters()])
        opt_d.step()

    results = []
    for algorithm, fusion_mb, overlap, accumulate in _cases(collectives.ALGORITHMS):
        cfg = config.load(
            {
                "algorithm": algorithm,
                "fusion_mb": fusion_mb,
                "overlap": overlap,
                "accumulate": accumulate,
                "workers": n,
                "batch_size": GLOBAL_BATCH,
            }
        )
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        strategy = strategies.get("allreduce").build(cfg, world, F.cross_entropy)
        strategy.setup(model, opt)
        worst_ref = worst_ddp = 0.0
        for step in range(2):
            x, y = _data(step)
            opt.zero_grad(set_to_none=True)
            # as the step runner calls it: K micro-batches through the Accumulates capability
            run = strategy.accumulated if accumulate > 1 else strategy.forward_backward
            run(x[shard], y[shard])
            strategy.after_backward()
            grads = [p.grad.clone() for p in model.parameters()]
            worst_ref = max(worst_ref, _max_diff(grads, ref_grads[step]))
            worst_ddp = max(worst_ddp, _max_diff(grads, ddp_grads[step]))
            opt.step()
        stats = strategy.reducer.stats()
        strategy.finish()
        results.append(
            {
                "case": (algorithm, fusion_mb, overlap, accumulate),
                "ref": worst_ref,
                "ddp": worst_ddp,
                "buckets": stats["buckets"],
                "in_backward": stats["launched_in_backward"],
            }
        )
    dist.barrier()
    return results


def test_gradients_equal_ddp_and_single_process_for_every_algorithm() -> None:
    from disttrain import collectives

    results = run_world(_compare_all, 2, timeout=170)
    for per_rank in results:
        assert {res["case"][0] for res in per_rank} == set(collectives.ALGORITHMS)
        for res in per_rank:
            assert res["ref"] < TOL, res
            assert res["ddp"] < TOL, res
            _, fusion_mb, overlap, _ = res["case"]
            # 6 tensors: one bucket each with fusion off, several at 1 kB, one at 25 MB
            assert res["buckets"] == {0.0: 6, 0.001: res["buckets"], 25.0: 1}[fusion_mb]
            if fusion_mb == 0.001:
                assert 1 < res["buckets"] < 6
            # with overlap, every bucket but none of the work waits for synchronize()
            assert (res["in_backward"] == 2 * res["buckets"]) == overlap, res


def test_three_ranks_native_and_point_to_point() -> None:
    results = run_world(_compare_all, 3, timeout=170)
    for per_rank in results:
        for res in per_rank:
            assert res["ref"] < TOL and res["ddp"] < TOL, res


def test_bad_settings_are_usage_errors() -> None:
    import pytest

    import disttrain.strategies  # noqa: F401  (the allreduce settings section registers itself)
    from disttrain import config
    from disttrain.comm.errors import UsageError

    with pytest.raises(UsageError, match="--fusion-mb"):
        config.load({"fusion_mb": -1.0})
    with pytest.raises(UsageError, match="--accumulate"):
        config.load({"accumulate": 0})
    cfg = config.load({"fusion_mb": 4, "overlap": False, "accumulate": 2})  # TOML ints coerced
    from disttrain.strategies.allreduce import DataParallelConfig

    assert cfg.section(DataParallelConfig) == DataParallelConfig(4.0, False, 2)
