"""roundrobin with 1, 2 (the default) or all rounds in flight, against native, interleaved.

    disttrain bench roundrobin-depth --workers 4 --sizes 16MB --iters 30

The variants are ``RoundRobin`` with another ``depth``: ``roundrobin_depth1``
(one round at a time: post, wait, sum; what roundrobin did before) and
``roundrobin_all`` (every round posted at once, n-1 receive buffers in the
reduce-scatter). They are registered for this run only, here and in every rank
(:class:`~disttrain.lab.bench._variants.InRanks`). Every other flag is
``disttrain bench allreduce``'s; the table is its table.
"""

from __future__ import annotations

import argparse

from disttrain.lab.bench import allreduce as bench_allreduce
from disttrain.lab.bench._variants import InRanks

__all__ = ["add_arguments", "run"]

VARIANTS = "native,roundrobin_depth1,roundrobin,roundrobin_all"


def _register() -> None:
    from dataclasses import replace

    from disttrain.collectives.base import ALGORITHMS, register
    from disttrain.collectives.roundrobin import RoundRobin

    class OneRound(RoundRobin):
        name = "roundrobin_depth1"
        depth = 1

    class AllRounds(RoundRobin):
        name = "roundrobin_all"
        depth = 1 << 16

    for variant in (OneRound, AllRounds):  # roundrobin's facts and terms, another depth
        register(replace(ALGORITHMS.get("roundrobin"), runtime=variant))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    bench_allreduce.add_arguments(parser)
    parser.set_defaults(algorithms=VARIANTS)


def run(args: argparse.Namespace) -> int:
    args.variants = InRanks(_register)
    return bench_allreduce.run(args)
