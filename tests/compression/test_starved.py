"""A sparse compressor that sends almost nothing says so once, after WINDOW exchanges."""

from __future__ import annotations

import pytest
import torch

from disttrain.compression.registry import parse
from disttrain.compression.starved import WINDOW, StarvedCheck


def _feed(spec: str, scale: float = 0.01) -> StarvedCheck:
    compressor = parse(spec)
    check = StarvedCheck(compressor)
    gen = torch.Generator().manual_seed(0)
    for _ in range(WINDOW + 5):  # past the window: still one verdict
        check.count(compressor.compress(torch.randn(50_000, generator=gen) * scale))
    return check


def test_a_threshold_above_every_entry_warns_once_naming_a_setting_that_sends(
    capsys: pytest.CaptureFixture[str],
) -> None:
    check = _feed("onebit:0.5")
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"warning: --compression onebit:0.5 sent 0 of {WINDOW * 50_000:,} ")
    assert err.rstrip().endswith("try --compression onebit:0.03")
    assert check.exchanges == WINDOW


@pytest.mark.parametrize("spec", ["onebit:0.02", "topk:0.001", "topk:0.5"])
def test_a_compressor_that_sends_its_share_says_nothing(
    spec: str, capsys: pytest.CaptureFixture[str]
) -> None:
    check = _feed(spec)
    assert check.entries > 0 and check.verdict() is None
    assert capsys.readouterr().err == ""


def test_a_dense_cast_is_not_counted() -> None:
    check = _feed("fp16")
    assert check.exchanges == 0 and check.verdict() is None
