"""The named models' layers sum to their papers' totals; eq. 3 of Narayanan et al."""

from __future__ import annotations

import pytest

from disttrain.lab.scenario import models


@pytest.mark.parametrize(
    ("name", "params", "gmacs"),
    [
        ("resnet50", 25.56e6, 4.09),
        ("resnet101", 44.55e6, 7.80),
        ("vgg16", 138.36e6, 15.47),
        ("alexnet", 61.10e6, 0.714),
        ("inception3", 23.83e6, 5.73),
    ],
)
def test_cnn_totals(name: str, params: float, gmacs: float) -> None:
    m = models.build(name)
    assert m.params == pytest.approx(params, rel=0.01)
    assert m.flops / 2e9 == pytest.approx(gmacs, rel=0.01)


def test_bert_large_is_a_third_of_a_billion() -> None:
    m = models.build("bert-large", seq_len=128)
    assert m.params == pytest.approx(334e6, rel=0.01)
    assert m.blocks == 24 and m.hidden == 1024


def test_megatron_flops_are_eq_3_with_recomputation() -> None:
    s, n, h, v = 2048, 96, 12288, 51200
    m = models.build("gpt", seq_len=s, layers=n, hidden=h, vocab=v)
    eq3 = 96 * s * n * h * h * (1 + s / (6 * h) + v / (16 * n * h))
    assert models.megatron_flops_per_sample(m, True) == pytest.approx(eq3)
    # without recomputation the layers' forward runs once: 72 instead of 96
    no_ckpt = 72 * s * n * h * h * (1 + s / (6 * h)) + 6 * s * h * v
    assert models.megatron_flops_per_sample(m, False) == pytest.approx(no_ckpt)


def test_a_cnn_step_is_three_forwards() -> None:
    m = models.build("resnet50")
    assert models.megatron_flops_per_sample(m, False) == pytest.approx(3 * m.flops)
    assert models.megatron_flops_per_sample(m, True) == pytest.approx(4 * m.flops)
