"""The servers' momentum in each mode: asynchrony's implicit momentum 1 - 1/N is taken out
of --momentum in async and ssp (Mitliagkas et al. 2016), nowhere else."""

from __future__ import annotations

import pytest

from disttrain.ps.config import server_momentum
from disttrain.ps.consistency import MODES


@pytest.mark.parametrize(
    ("mode", "workers", "expected"),
    [("async", 2, 0.4), ("ssp", 4, 0.15), ("async", 10, 0.0), ("ssp", 64, 0.0),
     ("sync", 2, 0.9), ("softsync", 4, 0.9)],
)  # fmt: skip
def test_server_momentum(mode: str, workers: int, expected: float) -> None:
    assert server_momentum(0.9, mode, workers) == pytest.approx(expected)


def test_compensation_can_be_switched_off_and_covers_every_mode() -> None:
    for mode in MODES:
        assert server_momentum(0.9, mode, 2, compensate=False) == 0.9
    assert server_momentum(0.0, "async", 2) == 0.0  # never negative
