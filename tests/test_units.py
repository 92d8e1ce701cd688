"""Byte counts as people read them: the summary table's and the memory plan's."""

from __future__ import annotations

import pytest

from disttrain.units import human_bytes


@pytest.mark.parametrize(
    ("nbytes", "shown"),
    [
        (0, "0 B"),
        (402.0, "402 B"),
        (999, "999 B"),
        (1000, "1 kB"),
        (25_800_000, "25.8 MB"),
        (1_234_567_890, "1.23 GB"),
        (49.4e9, "49.4 GB"),
        (2e12, "2 TB"),
    ],
)
def test_three_significant_figures_in_decimal_units(nbytes: float, shown: str) -> None:
    assert human_bytes(nbytes) == shown
