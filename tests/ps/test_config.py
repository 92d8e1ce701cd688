"""The servers' momentum in each mode: in async and ssp, 1 - N²(1 - m), the one whose
effective step equals the synchronous run's (N updates per step, asynchrony's implicit
momentum 1 - 1/N: Mitliagkas et al. 2016); --momentum as given elsewhere."""

from __future__ import annotations

import pytest

from disttrain.ps.config import server_momentum
from disttrain.ps.consistency import MODES


@pytest.mark.parametrize(
    ("mode", "workers", "expected"),
    [("async", 2, 0.6), ("ssp", 2, 0.6), ("async", 3, 0.1), ("ssp", 4, 0.0),
     ("sync", 2, 0.9), ("softsync", 4, 0.9)],
)  # fmt: skip
def test_server_momentum(mode: str, workers: int, expected: float) -> None:
    got = server_momentum(0.9, mode, workers)
    assert got == pytest.approx(expected)
    if mode in ("async", "ssp") and got > 0:  # the effective steps agree: N²/(1-μe) = 1/(1-μ)
        assert workers**2 / (1 - got) == pytest.approx(1 / (1 - 0.9))


def test_compensation_can_be_switched_off_and_covers_every_mode() -> None:
    for mode in MODES:
        assert server_momentum(0.9, mode, 2, compensate=False) == 0.9
    assert server_momentum(0.0, "async", 2) == 0.0  # never negative
