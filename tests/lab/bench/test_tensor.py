"""The paired tensor-slicing bench: round order, the paired summary, and its report on 2 ranks."""

from __future__ import annotations

import argparse

import pytest

from disttrain.lab.bench import _tensor as bench_tensor
from tests.harness import run_world


def test_rotation_puts_each_variant_first_in_turn() -> None:
    names = bench_tensor.VARIANTS
    orders = [bench_tensor.rotation(names, i) for i in range(len(names))]
    assert [o[0] for o in orders] == list(names)
    assert all(sorted(o) == sorted(names) for o in orders)
    assert bench_tensor.rotation(names, len(names)) == orders[0]


def test_summarize_pairs_rounds_not_medians() -> None:
    # round by round, megatron is 0.5x, 2x, 0.5x DTensor: the paired median is 0.5,
    # while the ratio of the medians (2 / 2) is 1
    steps = {"megatron": [1.0, 8.0, 2.0], "dtensor": [2.0, 4.0, 4.0]}
    out = bench_tensor.summarize(steps, {"megatron": 10.0, "dtensor": 0.0})
    assert out["megatron"]["paired"] == pytest.approx(0.5)
    assert out["megatron"]["ratio"] == pytest.approx(2.0 / 4.0)
    assert out["megatron"]["step"] == 2.0 and out["megatron"]["bytes_per_step"] == 10.0
    assert "paired" not in out["dtensor"]


def _paired(width: int) -> dict[str, object]:
    a = argparse.Namespace(width=width, batch=8, repeats=3)
    return bench_tensor.paired_steps(a)


def test_paired_steps_report_on_two_ranks() -> None:
    out = run_world(_paired, 2, args=(16,), timeout=120)
    for report in out:
        assert sorted(report) == sorted(bench_tensor.VARIANTS)
        for name in ("megatron", "naive"):
            assert report[name]["paired"] > 0 and report[name]["step"] > 0
        # our meter sees our messages only: DTensor's collectives are not ours
        assert report["dtensor"]["bytes_per_step"] == 0
        assert 0 < report["megatron"]["bytes_per_step"] < report["naive"]["bytes_per_step"]
