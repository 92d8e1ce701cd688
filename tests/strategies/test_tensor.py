"""Tensor slicing (Megatron pairs and the naive split) equals the unsplit model after 10 steps."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from disttrain.comm.errors import UsageError
from tests.harness import SharedWorlds
from tests.parallel import reference as ref


def _full_view(kind: str, pname: str, full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """The slice of the whole model's tensor that a shard holds."""
    if kind in ("col", "colgather"):
        n = full.shape[0] // size
        return full[rank * n : (rank + 1) * n]
    if kind == "row" and pname == "weight":
        n = full.shape[1] // size
        return full[:, rank * n : (rank + 1) * n]
    return full


def _run(mode: str) -> dict[str, Any]:
    import torch.distributed as dist

    from disttrain.collectives import set_length_check
    from disttrain.comm import world
    from disttrain.comm.meter import meter
    from disttrain.strategies.tensor import TensorParallel
    from disttrain.train.trainer import loss_fn

    set_length_check(False)  # count the slicing's own messages, not the debug check's
    rank, size = dist.get_rank(), dist.get_world_size()
    data = ref.batches(16)
    want, want_losses = ref.reference(ref.model(), data)
    cfg = ref.config(workers=size, strategy="tensor", batch_size=16, tensor_mode=mode)
    strategy = TensorParallel(cfg, world.current(), loss_fn)
    meter.reset()
    part, losses = ref.train(strategy, ref.model(), data)
    sent = meter.snapshot()
    worst = 0.0
    for (name, layer), kind in zip(part.named_children(), strategy.kinds, strict=True):
        for pname, p in layer.named_parameters():
            w = want.get_submodule(name).get_parameter(pname)
            assert p.grad is not None and w.grad is not None
            worst = max(worst, (p - _full_view(kind, pname, w, rank, size)).abs().max().item())
            g = _full_view(kind, pname, w.grad, rank, size)
            worst = max(worst, (p.grad - g).abs().max().item())
    worst = max(worst, max(abs(a - b) for a, b in zip(losses, want_losses, strict=True)))
    whole = strategy.eval_model()
    if whole is not None:
        for name, p in whole.named_parameters():
            worst = max(worst, (p - want.get_parameter(name)).abs().max().item())
    return {
        "worst": worst,
        "kinds": strategy.kinds,
        "messages": sent.messages_sent,
        "bytes": sent.bytes_sent,
    }


MODES = ("megatron", "naive")
#: both modes in one world of 2 ranks (1 spawn instead of 2; each resets the meter)
RUNS = SharedWorlds({mode: (2, _run, (mode,)) for mode in MODES}, timeout=150)


@pytest.mark.timeout(200)  # the first case runs the shared world
@pytest.mark.parametrize("mode", MODES)
def test_tensor_slicing_equals_the_unsplit_model(mode: str) -> None:
    results = RUNS.get(mode)
    for r in results:
        assert r["worst"] < ref.TOL, r
    kinds = results[0]["kinds"]
    if mode == "megatron":
        # Flatten, (12->16 col, ReLU, 16->24 row), ReLU, (24->16 col, ReLU, 16->5 row)
        assert kinds == ["rep", "col", "rep", "row", "rep", "col", "rep", "row"]
        # per step: 2 forward allreduces + 1 backward (the first pair's input needs no gradient)
        assert results[0]["messages"] == ref.STEPS * 3 * 2
    else:
        assert kinds == ["rep", "colgather", "rep", "colgather", "rep", "colgather", "rep", "rep"]
        # per step: 3 gathers (1 message each on 2 ranks) + 2 backward allreduces (2 each)
        assert results[0]["messages"] == ref.STEPS * (3 + 2 * 2)


def test_bad_widths_are_refused_before_start() -> None:
    from disttrain.strategies.tensor import TensorSettings

    cfg = ref.config(strategy="tensor", workers=7, batch_size=14)
    with pytest.raises(UsageError, match="--workers 7: no Linear layer's width"):
        TensorSettings.validate_config(cfg, ref.model())
    with pytest.raises(UsageError, match=r"nn\.Sequential"):
        TensorSettings.validate_config(cfg, torch.nn.Linear(4, 4))
