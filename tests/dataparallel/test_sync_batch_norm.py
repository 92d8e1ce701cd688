"""disttrain's SyncBatchNorm, where torch's refuses CPU input: a model converted as with
``torch.nn.SyncBatchNorm.convert_sync_batchnorm``, on 2 ranks without Horovod's init,
equals one BatchNorm on the concatenated batch (output, input gradient, running statistics),
over the default group and over a group given. Horovod's own cases (uneven and empty
ranks, 2-D to 4-D, float64) are tests/horovod/test_sync_batch_norm.py, on the same code.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from disttrain.dataparallel.sync_batch_norm import SyncBatchNorm, convert_sync_batchnorm
from tests.harness import run_world


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.ReLU())


def test_convert_replaces_every_batch_norm_and_keeps_its_tensors() -> None:
    model = nn.Sequential(_model(), nn.BatchNorm2d(2, affine=True, momentum=None).eval())
    bn1d, weight, mean = model[0][1], model[0][1].weight, model[0][1].running_mean
    converted = convert_sync_batchnorm(model)
    assert converted is model  # in place, as torch's
    first, second = converted[0][1], converted[1]
    assert isinstance(first, SyncBatchNorm) and isinstance(second, SyncBatchNorm)
    assert first is not bn1d and first.weight is weight and first.running_mean is mean
    assert second.momentum is None and not second.training
    lone = SyncBatchNorm.convert_sync_batchnorm(nn.BatchNorm1d(5, affine=False))
    assert isinstance(lone, SyncBatchNorm) and lone.weight is None
    x = torch.randn(6, 4)  # one process, no process group: a plain batch norm
    torch.testing.assert_close(converted[0](x), _model()(x), rtol=0, atol=0)


def _global_batch(group_given: bool) -> dict[str, Any]:
    import torch.distributed as dist

    from disttrain.comm import forming

    rank = dist.get_rank()
    group = forming.new_group([0, 1]) if group_given else None
    gen = torch.Generator().manual_seed(3)
    x_all = torch.randn(10, 4, generator=gen) * 2 + 1
    rows = slice(0, 4) if rank == 0 else slice(4, 10)  # 4 and 6 samples
    ours = SyncBatchNorm.convert_sync_batchnorm(_model(), group)
    ref = _model()
    x = x_all[rows].clone().requires_grad_()
    x_ref = x_all.clone().requires_grad_()
    out, out_ref = ours(x), ref(x_ref)
    out.sum().backward()
    out_ref.sum().backward()
    assert x.grad is not None and x_ref.grad is not None
    bn, bn_ref = ours[1], ref[1]
    return {
        "output": float((out - out_ref[rows]).abs().max()),
        "input_grad": float((x.grad - x_ref.grad[rows]).abs().max()),
        "running_mean": float((bn.running_mean - bn_ref.running_mean).abs().max()),
        "running_var": float((bn.running_var - bn_ref.running_var).abs().max()),
    }


def _world() -> dict[str, Any]:
    return {"default": _global_batch(False), "group": _global_batch(True)}


@pytest.mark.timeout(120)
def test_two_ranks_equal_one_batch_norm_on_the_global_batch() -> None:
    for got in run_world(_world, 2, timeout=90):
        for case in ("default", "group"):
            for key, err in got[case].items():
                assert err < 1e-5, (case, key, err)
