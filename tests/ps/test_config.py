"""Each push's share of the learning rate: 1/N in async and ssp (every worker's gradient,
of B/N samples, applied alone), 1 in sync and softsync: N pushes at lr/N make the
synchronous step lr·mean(g) in N parts."""

from __future__ import annotations

import pytest

from disttrain.ps.config import push_lr_share
from disttrain.ps.consistency import MODES


@pytest.mark.parametrize(
    ("mode", "workers", "expected"),
    [
        ("async", 2, 0.5),
        ("ssp", 2, 0.5),
        ("async", 3, 1 / 3),
        ("ssp", 4, 0.25),
        ("sync", 2, 1.0),
        ("softsync", 4, 1.0),
    ],
)
def test_push_lr_share(mode: str, workers: int, expected: float) -> None:
    assert push_lr_share(mode, workers) == pytest.approx(expected)


def test_the_share_can_be_switched_off_in_every_mode() -> None:
    for mode in MODES:
        assert push_lr_share(mode, 2, share=False) == 1.0
