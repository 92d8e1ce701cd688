"""Every registered algorithm as a DDP communication hook gives DDP's own gradients (1e-5)."""

from __future__ import annotations

import copy

import torch

from tests.harness import run_world


def _hook_vs_plain_ddp() -> dict[str, float]:
    from torch.nn import functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from disttrain import collectives
    from disttrain.dataparallel.ddp_hooks import AlgorithmHook, allreduce_hook
    from disttrain.models import mlp

    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    base = mlp(16, 4, hidden=(24, 20))
    g = torch.Generator().manual_seed(7 + rank)
    x, y = torch.randn(6, 16, generator=g), torch.randint(0, 4, (6,), generator=g)

    def grads(model: DDP) -> list[torch.Tensor]:
        # DDP starts with one bucket and rebuilds them by --bucket-cap-mb after the
        # first backward: the second pass exercises several buckets (several hook calls)
        for _ in range(2):
            model.zero_grad()
            F.cross_entropy(model(x), y).backward()
        return [p.grad.clone() for p in model.parameters()]

    want = grads(DDP(copy.deepcopy(base)))
    out = {}
    for algorithm in collectives.ALGORITHMS:
        model = DDP(copy.deepcopy(base), bucket_cap_mb=0.001)
        state = AlgorithmHook(algorithm)
        model.register_comm_hook(state, allreduce_hook)
        got = grads(model)
        assert state.buckets > 2, state.buckets
        out[algorithm] = max(float((a - b).abs().max()) for a, b in zip(got, want, strict=True))
        state.close()
    return out


def test_each_algorithm_as_a_ddp_comm_hook_matches_ddp() -> None:
    for per_rank in run_world(_hook_vs_plain_ddp, 2, timeout=120):
        from disttrain import collectives

        assert set(per_rank) == set(collectives.ALGORITHMS)
        for algorithm, diff in per_rank.items():
            assert diff < 1e-5, (algorithm, diff)
