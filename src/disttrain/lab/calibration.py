"""Fits of the cost model's constants (the constants and their file: :mod:`disttrain.calibration`).

Fits are weighted least squares on *relative* residuals (each row divided by its
measured time), so a 4 KB allreduce of 200 us counts as much as a 64 MB one of
0.5 s, with the constraint that every constant is non-negative (all subsets of the
unknowns are tried; the best non-negative one wins: exact for 2-3 unknowns).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from disttrain.calibration import DEFAULT_PATH, Calibration

__all__ = [
    "DEFAULT_PATH",
    "Calibration",
    "fit_compute",
    "fit_link",
    "nonneg_relative_lstsq",
]


def nonneg_relative_lstsq(rows: Sequence[Sequence[float]], times: Sequence[float]) -> list[float]:
    """x >= 0 minimising Σ ((rows·x - t) / t)²: every subset of unknowns, best feasible fit."""
    a = np.asarray(rows, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    if a.ndim != 2 or len(a) != len(t) or len(t) == 0:
        raise ValueError("need one row of features per measured time")
    if np.any(t <= 0):
        raise ValueError("measured times must be positive")
    w = a / t[:, None]
    k = a.shape[1]
    best: tuple[float, list[float]] = (float("inf"), [0.0] * k)
    for size in range(k, 0, -1):
        for cols in itertools.combinations(range(k), size):
            sol, *_ = np.linalg.lstsq(w[:, cols], np.ones(len(t)), rcond=None)
            if np.any(sol < 0):
                continue
            x = [0.0] * k
            for c, v in zip(cols, sol, strict=True):
                x[c] = float(v)
            err = float(np.sum((w @ np.asarray(x) - 1.0) ** 2))
            if err < best[0] - 1e-15:
                best = (err, x)
    return best[1]


def fit_link(paths: Sequence[tuple[int, int, int]], times: Sequence[float]) -> tuple[float, ...]:
    """(α, β, γ) from measured allreduce times and their (steps, critical bytes, reduced bytes)."""
    a, b, g = nonneg_relative_lstsq([list(p) for p in paths], times)
    return a, b, g


def fit_compute(
    points: Sequence[tuple[float, float]], params: int, flops_per_sample: float
) -> tuple[float, float]:
    """(seconds per flop, seconds per parameter) from (samples per rank, step seconds) points.

    step = samples·flops_per_sample·s_flop + params·s_param: two or more batch sizes.
    """
    rows = [[samples * flops_per_sample, float(params)] for samples, _ in points]
    s_flop, s_param = nonneg_relative_lstsq(rows, [t for _, t in points])
    return s_flop, s_param
