"""The mesh layout: replicas of consecutive ranks, dp groups across them."""

from __future__ import annotations

import pytest

from disttrain.parallel.mesh import layout


def test_layout_2x2_and_4x1() -> None:
    assert layout(4, 2) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    assert layout(4, 4) == ([[0], [1], [2], [3]], [[0, 1, 2, 3]])
    assert layout(3, 1) == ([[0, 1, 2]], [[0], [1], [2]])
    with pytest.raises(ValueError, match="do not divide"):
        layout(4, 3)
