"""Learning-rate rules: linear scaling, warm-up and the decays."""

from __future__ import annotations

import math

import pytest

from disttrain.train.schedules import LRSchedule


def test_linear_scaling_follows_the_global_batch() -> None:
    s = LRSchedule(
        lr=0.1,
        global_batch=512,
        total_steps=100,
        steps_per_epoch=10,
        scaling="linear",
        base_batch_size=64,
    )
    assert s(0) == pytest.approx(0.8) and s(99) == pytest.approx(0.8)


def test_warm_up_ramps_from_the_base_rate_to_the_scaled_one() -> None:
    s = LRSchedule(
        lr=0.1,
        global_batch=256,
        total_steps=100,
        steps_per_epoch=10,
        scaling="linear",
        base_batch_size=64,
        warmup_epochs=2,
    )
    assert s(0) == pytest.approx(0.1)
    assert s(10) == pytest.approx(0.25)  # half-way through 20 warm-up steps
    assert s(20) == pytest.approx(0.4)


def test_warm_up_without_scaling_starts_near_zero() -> None:
    s = LRSchedule(lr=0.2, global_batch=64, total_steps=100, steps_per_epoch=10, warmup_epochs=1)
    assert s(0) == pytest.approx(0.02) and s(10) == pytest.approx(0.2)


def test_cosine_decays_to_zero_after_warm_up() -> None:
    s = LRSchedule(
        lr=1.0,
        global_batch=64,
        total_steps=110,
        steps_per_epoch=10,
        warmup_epochs=1,
        schedule="cosine",
    )
    assert s(10) == pytest.approx(1.0)
    assert s(60) == pytest.approx(0.5)
    assert s(110) == pytest.approx(0.0, abs=1e-12)


def test_exponential_and_step_decays() -> None:
    e = LRSchedule(
        lr=1.0,
        global_batch=64,
        total_steps=100,
        steps_per_epoch=10,
        schedule="exponential",
        gamma=0.5,
    )
    assert e(20) == pytest.approx(0.25)
    st = LRSchedule(
        lr=1.0, global_batch=64, total_steps=100, steps_per_epoch=10, schedule="step", step_epochs=3
    )
    assert [st(t) for t in (0, 29, 30, 60)] == pytest.approx([1.0, 1.0, 0.1, 0.01])
    assert math.isclose(LRSchedule(1.0, 64, 10, 10, schedule="exponential")(10), 0.9)
