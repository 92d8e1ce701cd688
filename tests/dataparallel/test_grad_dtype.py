"""Gradients on the wire in 16 bits: half the metered bytes, the average within 16-bit precision.

One spelling: ``--compression fp16|bf16`` on the allreduce strategy, and the
same spec strings (or the cast compressor) as the reducer's and
``DistributedOptimizer``'s ``compression=``. On the allreduce strategy a cast
rides the reducer's fused buckets, so ``--fusion-mb`` and overlap still hold.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.harness import SharedWorlds


def _reduce(compression: Any) -> tuple[list[torch.Tensor], int]:
    import torch.distributed as dist

    from disttrain.comm.meter import meter
    from disttrain.compression import parse
    from disttrain.dataparallel.reducer import Reducer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    if isinstance(compression, str) and compression.startswith("object:"):
        compression = parse(compression.removeprefix("object:"))  # the compressor itself
    reducer = Reducer(list(model.parameters()), compression=compression)
    torch.manual_seed(1 + dist.get_rank())  # each rank its own batch
    meter.reset()
    model(torch.randn(16, 32)).square().mean().backward()
    reducer.synchronize()
    reducer.close()
    return [p.grad.clone() for p in model.parameters()], meter.bytes_sent


def _strategy_step(compression: str) -> dict[str, Any]:
    from disttrain import config, strategies
    from disttrain.comm import world
    from disttrain.comm.meter import meter
    from disttrain.train.trainer import loss_fn

    # the backend's own allreduce (the default, auto, has no launcher's table here: native
    # too, through its own wrapper, whose length check adds its metered bytes)
    flags = {"compression": compression, "fusion_mb": 0.001, "batch_size": 32}
    cfg = config.load({**flags, "algorithm": "native"})
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy = strategies.get("allreduce").build(cfg, world.current(), loss_fn)
    strategy.setup(model, optimizer)
    meter.reset()
    torch.manual_seed(1 + world.current().rank)
    optimizer.zero_grad()
    strategy.forward_backward(torch.randn(16, 8), torch.randint(0, 3, (16,)))
    strategy.after_backward()
    grads = [p.grad.clone() for p in model.parameters()]
    strategy.finish()
    summary = strategy.summary()["data_parallel"]
    return {"bytes": meter.bytes_sent, "grads": grads, **summary}


#: every run of this file, one after another in one world of 2 ranks (1 spawn instead of
#: 8: a spawn's start-up costs more than these runs; each resets the meter and its seeds)
RUNS = SharedWorlds(
    {
        "reduce none": (2, _reduce, (None,)),
        **{f"reduce {c}": (2, _reduce, (c,)) for c in ("fp16", "bf16", "object:fp16")},
        "step none": (2, _strategy_step, ("none",)),
        "step fp16": (2, _strategy_step, ("fp16",)),
    },
    timeout=240,
)


@pytest.mark.timeout(300)  # the first test runs the shared world
@pytest.mark.parametrize(
    ("compression", "rtol"), [("fp16", 2e-3), ("bf16", 1.6e-2), ("object:fp16", 2e-3)]
)
def test_16_bit_gradients_halve_the_bytes_and_keep_the_average(
    compression: str, rtol: float
) -> None:
    exact, exact_bytes = RUNS.get("reduce none")[0]
    cast, cast_bytes = RUNS.get(f"reduce {compression}")[0]
    assert cast_bytes * 2 == exact_bytes
    for a, b in zip(exact, cast, strict=True):
        # the relative error of one rounding to the type, summed over 2 ranks
        assert torch.allclose(b, a, rtol=rtol, atol=rtol * float(a.abs().max()))


def test_none_is_fp32_and_a_sparse_compressor_is_refused() -> None:
    from disttrain.comm.errors import UsageError
    from disttrain.dataparallel.reducer import wire_dtype

    assert wire_dtype(None) is None and wire_dtype("none") is None
    assert wire_dtype("bf16") == torch.bfloat16
    with pytest.raises(UsageError, match="cast only"):
        wire_dtype("topk:0.1")
    with pytest.raises(UsageError, match="--compression 'zip'"):
        wire_dtype("zip")


def test_compression_fp16_on_the_allreduce_strategy_keeps_fusion_and_overlap() -> None:
    dense, half = RUNS.get("step none")[0], RUNS.get("step fp16")[0]
    assert half["bytes"] * 2 == dense["bytes"]
    # --fusion-mb 0.001 (1 kB buckets) still splits the model, and buckets leave in backward
    assert half["buckets"] == dense["buckets"] > 1
    assert half["launched_in_backward"] == dense["launched_in_backward"] > 0
    for a, b in zip(dense["grads"], half["grads"], strict=True):
        assert torch.allclose(b, a, rtol=2e-3, atol=2e-3 * float(a.abs().max()))
