"""The cost model's terms of one allreduce: its critical path (cached by name, with the totals
over every rank) and its step formula.

Each algorithm states its own critical path in its :class:`~disttrain.collectives.costs.CostTerms`
(registered with it, built from its ``cost()``: see :mod:`disttrain.collectives.costs` for the
model ``time = steps·α + critical_bytes·β + reduced_bytes·γ + copied_bytes·μ``). This module
reads it, caches it (the cost model asks for the same bucket sizes again and again, and
n = 10,000 costs O(n) per rank) and adds what every rank sends together, for ranks that share
a host.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from disttrain.collectives.base import ALGORITHMS, Algorithm, resolve
from disttrain.collectives.costs import NOTHING, Cost, Path

__all__ = ["Path", "critical_path", "path_of", "steps_formula"]


def path_of(algorithm: Algorithm, nbytes: int, n: int, itemsize: int = 4) -> Path:
    """The critical path of one allreduce of ``nbytes`` on ``n`` ranks (NOTHING when there is
    nothing to send), by the algorithm's own chain; ``algorithm`` may be a configured one."""
    if n <= 1 or nbytes == 0:
        return NOTHING
    algo = resolve(algorithm)
    return ALGORITHMS.get(algo.name).cost_terms.chain(algo, nbytes, n, itemsize)


def steps_formula(algorithm: Algorithm, n: int) -> str:
    """Dependent communication rounds on ``n`` ranks by the algorithm's formula ("-": none
    stated), for ``compare --algorithms-table``."""
    algo = resolve(algorithm)
    return ALGORITHMS.get(algo.name).cost_terms.steps(algo, n)


@lru_cache(maxsize=4096)  # buckets repeat one size; n = 10,000 costs O(n) per rank
def critical_path(algorithm: str, nbytes: int, n: int, itemsize: int = 4) -> Path:
    """The critical path of one allreduce of ``nbytes`` on ``n`` ranks with ``algorithm`` (its
    default settings), with what all ranks send together."""
    algo = resolve(algorithm)
    path = path_of(algo, nbytes, n, itemsize)
    if n <= 64:  # exact sums; beyond, n times the busiest rank (an upper bound)
        costs = [algo.cost(nbytes, n, r, itemsize) for r in range(n)]
        total = Cost(
            sum(c.bytes_sent for c in costs),
            sum(c.messages for c in costs),
            sum(c.bytes_copied for c in costs),
        )
    else:
        total = Cost(n * path.bytes_per_rank, n * path.messages_per_rank, n * path.copied_bytes)
    return replace(
        path,
        total_messages=total.messages,
        total_bytes=total.bytes_sent,
        total_copied=total.bytes_copied,
    )
