"""Error feedback conserves mass: sent + residual == sum of inputs."""

from __future__ import annotations

import torch

from disttrain.compression import ErrorFeedback, parse


def _dyadic(step: int, n: int = 2000) -> torch.Tensor:
    # multiples of 2^-12 below 4: every sum below is exact in fp32
    g = torch.Generator().manual_seed(step)
    return torch.randint(-(2**14), 2**14, (n,), generator=g).float() / 2**12


def test_onebit_mass_is_conserved_exactly() -> None:
    ef = ErrorFeedback(parse("onebit:0.5"))  # tau a power of two: quantized part exact
    inputs = torch.zeros(2000)
    sent = torch.zeros(2000)
    for step in range(30):
        x = _dyadic(step)
        inputs += x
        _, s = ef.compress(x)
        assert set(s.unique().tolist()) <= {-0.5, 0.0, 0.5}
        sent += s
        assert ef.residual is not None
        assert torch.equal(sent + ef.residual, inputs)


def test_topk_and_fp16_conserve_mass_within_rounding() -> None:
    for spec in ("topk:0.01", "fp16", "none"):
        ef = ErrorFeedback(parse(spec))
        inputs = torch.zeros(3000, dtype=torch.float64)
        sent = torch.zeros(3000, dtype=torch.float64)
        for step in range(20):
            x = torch.randn(3000, generator=torch.Generator().manual_seed(step))
            inputs += x.double()
            sent += ef.compress(x)[1].double()
            assert ef.residual is not None
            torch.testing.assert_close(sent + ef.residual.double(), inputs, rtol=0, atol=1e-5)


def test_state_dict_round_trip() -> None:
    ef = ErrorFeedback(parse("onebit:1"))
    ef.compress(torch.randn(100))
    other = ErrorFeedback(parse("onebit:1"))
    other.load_state_dict(ef.state_dict())
    assert ef.residual is not None and other.residual is not None
    assert torch.equal(other.residual, ef.residual) and other.residual is not ef.residual
    x = torch.randn(100)
    assert torch.equal(ef.compress(x)[1], other.compress(x)[1])
    assert other.residual_norm() == ef.residual_norm() > 0


def test_disabled_feedback_keeps_no_residual() -> None:
    ef = ErrorFeedback(parse("onebit:1"), enabled=False)
    ef.compress(torch.randn(100))
    assert ef.residual is None and ef.residual_norm() == 0.0


def test_uncompressed_feedback_sends_everything() -> None:
    # regression: ``none`` once aliased its input, so the residual update zeroed what was sent
    ef = ErrorFeedback(parse("none"))
    x = torch.randn(50)
    _, sent = ef.compress(x)
    assert torch.equal(sent, x) and ef.residual_norm() == 0.0
