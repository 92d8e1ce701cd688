"""The multi-process test harness: :mod:`disttrain.launch.spawn`, which the benchmarks use too.

    results = run_world(fn, world_size=3, args=(...), timeout=60)

``fn(*args)`` runs on every rank after ``disttrain.comm.init()``; its return values
come back as a list indexed by rank. A rank that raised, died or outlived the
timeout fails the test, named (:class:`RankError`, :class:`WorldTimeout`).

Parametrized cases that each need a small world share one (:class:`SharedWorlds`):
a spawn costs every rank a fresh interpreter and torch import (about 1 s of CPU
each), often more than the case itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from disttrain.launch.spawn import RankError, WorldTimeout, run_world

__all__ = ["RankError", "SharedWorlds", "WorldTimeout", "run_world"]

Job = tuple[Callable[..., Any], tuple[Any, ...]]


def _in_turn(jobs: list[tuple[str, Callable[..., Any], tuple[Any, ...]]]) -> dict[str, Any]:
    """Every job on this rank, one after another (each rank runs the same list in order)."""
    out = {}
    for name, fn, args in jobs:
        try:
            out[name] = fn(*args)
        except Exception as exc:  # name the case; the world stops at the first failure
            raise RuntimeError(f"case {name!r}: {type(exc).__name__}: {exc}") from exc
    return out


class SharedWorlds:
    """Named jobs ``(world_size, fn, args)`` run in one world per world size, in order.

    ``get(name)`` spawns the world of ``name``'s size on first use, runs all its jobs
    one after another in the same ranks and returns ``name``'s per-rank results (a
    list by rank, as :func:`run_world` gives). Each job must set up what it depends
    on (seeds, models, strategies) itself: only the processes and their process
    group are shared. A job that fails fails every case of its world, with the
    failing case named.
    """

    def __init__(
        self,
        jobs: dict[str, tuple[int, Callable[..., Any], tuple[Any, ...]]],
        timeout: float,
        collective_timeout: float = 30.0,
    ) -> None:
        self.jobs = jobs
        self.timeout = timeout
        self.collective_timeout = collective_timeout
        self._done: dict[int, list[dict[str, Any]] | BaseException] = {}

    def get(self, name: str) -> list[Any]:
        size = self.jobs[name][0]
        if size not in self._done:
            jobs = [(n, fn, args) for n, (s, fn, args) in self.jobs.items() if s == size]
            try:
                self._done[size] = run_world(
                    _in_turn,
                    size,
                    args=(jobs,),
                    timeout=self.timeout,
                    collective_timeout=self.collective_timeout,
                )
            except (RankError, WorldTimeout) as exc:
                self._done[size] = exc
        done = self._done[size]
        if isinstance(done, BaseException):
            raise RankError(f"the shared world of {size} ranks failed:\n{done}") from done
        return [by_rank[name] for by_rank in done]
