"""Gradients on the wire in 16 bits: half the metered bytes, the average within 16-bit precision."""

from __future__ import annotations

import pytest
import torch

from tests.harness import run_world


def _reduce(compression: str | None) -> tuple[list[torch.Tensor], int]:
    import torch.distributed as dist

    from disttrain.comm.meter import meter
    from disttrain.dataparallel.reducer import Reducer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    reducer = Reducer(list(model.parameters()), compression=compression)
    torch.manual_seed(1 + dist.get_rank())  # each rank its own batch
    meter.reset()
    model(torch.randn(16, 32)).square().mean().backward()
    reducer.synchronize()
    reducer.close()
    return [p.grad.clone() for p in model.parameters()], meter.bytes_sent


@pytest.mark.parametrize(("compression", "rtol"), [("fp16", 2e-3), ("bf16", 1.6e-2)])
def test_16_bit_gradients_halve_the_bytes_and_keep_the_average(
    compression: str, rtol: float
) -> None:
    exact, exact_bytes = run_world(_reduce, 2, args=(None,))[0]
    cast, cast_bytes = run_world(_reduce, 2, args=(compression,))[0]
    assert cast_bytes * 2 == exact_bytes
    for a, b in zip(exact, cast, strict=True):
        # the relative error of one rounding to the type, summed over 2 ranks
        assert torch.allclose(b, a, rtol=rtol, atol=rtol * float(a.abs().max()))
