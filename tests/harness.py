"""The multi-process test harness: :mod:`disttrain.launch.spawn`, which the benchmarks use too.

    results = run_world(fn, world_size=3, args=(...), timeout=60)

``fn(*args)`` runs on every rank after ``disttrain.comm.init()``; its return values
come back as a list indexed by rank. A rank that raised, died or outlived the
timeout fails the test, named (:class:`RankError`, :class:`WorldTimeout`).
"""

from __future__ import annotations

from disttrain.launch.spawn import RankError, WorldTimeout, run_world

__all__ = ["RankError", "WorldTimeout", "run_world"]
