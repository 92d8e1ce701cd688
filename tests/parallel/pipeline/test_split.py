"""B (input gradient) then W (weight gradients) equal the fused backward bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from disttrain.parallel.pipeline import split


def _stages() -> list[nn.Module]:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 16), nn.Tanh())
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    block = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 16), nn.GELU())
    return [mlp, conv, block]


INPUTS = [(8, 12), (8, 3, 8, 8), (8, 16)]


@pytest.mark.parametrize("which", [0, 1, 2], ids=["mlp", "conv", "layernorm"])
def test_b_then_w_equals_the_fused_backward_bit_for_bit(which: int) -> None:
    stage = _stages()[which]
    twin = copy.deepcopy(stage)
    g = torch.Generator().manual_seed(1)
    recorder = split.Recorder(twin)
    for micro in range(3):  # gradients accumulate over micro-batches as in a step
        x = torch.randn(*INPUTS[which], generator=g)
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        out = stage(x1)
        grad = torch.randn(out.shape, generator=g)
        out.backward(grad)  # the fused backward
        with recorder.recording() as layers:
            out2 = twin(x2)
        grad_in, pending = split.backward_input(out2, grad, x2, layers)
        assert all(p.grad is None for p in twin.parameters()) or micro > 0
        assert grad_in is not None and torch.equal(grad_in, x1.grad)
        split.backward_weight(pending)
        for (name, p), p2 in zip(stage.named_parameters(), twin.parameters(), strict=True):
            assert p2.grad is not None, name
            assert torch.equal(p.grad, p2.grad), (name, (p.grad - p2.grad).abs().max())


def test_b_alone_leaves_the_weights_without_gradients() -> None:
    stage = _stages()[0]
    recorder = split.Recorder(stage)
    x = torch.randn(4, 12, requires_grad=True)
    with recorder.recording() as layers:
        out = stage(x)
    grad_in, pending = split.backward_input(out, torch.ones_like(out), x, layers)
    assert grad_in is not None and all(p.grad is None for p in stage.parameters())
    assert pending.nbytes == 4 * (32 + 16) * 4  # the two Linear outputs' gradients, fp32
    split.backward_weight(pending)
    assert all(p.grad is not None for p in stage.parameters())


def test_after_b_only_what_w_reads_stays_saved() -> None:
    # Linear(12,32) ReLU Linear(32,16) Tanh on 4 samples: F saves x (12), the ReLU's output
    # (32, also the second Linear's input: counted once) and Tanh's output (16); W reads the
    # Linears' inputs only (12 + 32), so B lets the Tanh's go
    from disttrain.parallel.pipeline.runner import ActivationMeter

    stage = _stages()[0]
    recorder = split.Recorder(stage)
    meter = ActivationMeter([p.detach() for p in stage.parameters()])
    x = torch.randn(4, 12, requires_grad=True)
    with meter.recording(recorder.inside) as saves, recorder.recording() as layers:
        out = stage(x)
    assert meter.live == 4 * (12 + 32 + 16) * 4
    _, pending = split.backward_input(out, torch.ones_like(out), x, layers)
    del out
    meter.release([t for t in saves if not t.for_w])
    assert meter.live == 4 * (12 + 32) * 4
    split.backward_weight(pending)  # reads only what stayed
    assert all(p.grad is not None and p.grad.grad_fn is None for p in stage.parameters())
    del pending, saves, layers
    assert meter.live == 0 and meter.peak == 4 * (12 + 32 + 16) * 4
