"""``[measured]``: the one-GPU rate backed out of a run the user timed on the same hardware.

A large model does not fit one GPU, so its one-GPU rate cannot be measured; one node (or
any small run) can. The model predicts the timed run from a one-GPU rate; this finds the
rate at which that prediction equals the timed figure (bisection in log: the prediction
rises with the rate), then predicts the scenario's run with it. What the one-GPU rate
stands for then cancels between the two runs, and the prediction carries only what
changes with scale (benchmarks/published: scale-out pairs).
"""

from __future__ import annotations

import dataclasses
import math

from disttrain.lab.scenario.spec import Scenario, ScenarioError
from disttrain.lab.scenario.steptime import predict

__all__ = ["anchored"]

#: the bisection's range of one-GPU samples/s, and its steps (each halves the log range:
#: 80 steps leave a relative error far below 1e-9)
_LOW, _HIGH, _STEPS = 1e-9, 1e12, 80


def _at(sc: Scenario, rate: float) -> Scenario:
    hw = dataclasses.replace(sc.hardware, gpu_samples_per_second=rate, gpu_tflops=None)
    return dataclasses.replace(sc, hardware=hw)


def anchored(sc: Scenario, path: str = "scenario") -> Scenario:
    """``sc`` with ``gpu_samples_per_second`` set so that its measured run is predicted at
    the measured figure; ``sc`` itself when it has no ``[measured]``."""
    m = sc.measured
    if m is None:
        return sc
    timed = dataclasses.replace(sc, run=m.run)
    ceiling = predict(_at(timed, _HIGH)).samples_per_second
    if m.samples_per_second >= ceiling:
        raise ScenarioError(
            f"{path}: [measured] samples_per_second: {m.samples_per_second:g} is above what "
            f"{m.run.gpus} GPUs reach at any GPU speed on this network ({ceiling:.4g}): "
            "check the links in [hardware]"
        )
    floor = predict(_at(timed, _LOW)).samples_per_second
    if m.samples_per_second <= floor:
        raise ScenarioError(
            f"{path}: [measured] samples_per_second: {m.samples_per_second:g} is below what "
            f"{m.run.gpus} GPUs reach at {_LOW:g} samples/s a GPU ({floor:.4g})"
        )
    lo, hi = math.log(_LOW), math.log(_HIGH)
    for _ in range(_STEPS):
        mid = (lo + hi) / 2
        if predict(_at(timed, math.exp(mid))).samples_per_second < m.samples_per_second:
            lo = mid
        else:
            hi = mid
    return _at(sc, math.exp((lo + hi) / 2))
