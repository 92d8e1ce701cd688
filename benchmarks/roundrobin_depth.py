"""roundrobin with 1, 2 (the default) or all rounds in flight, against native, interleaved.

    PYTHONPATH=src .venv/bin/python benchmarks/roundrobin_depth.py \
        --workers 4 --sizes 16MB --iters 30

The variants are ``RoundRobin`` with another ``depth``, registered here at
import; the bench's ranks are started with the ``spawn`` method, which imports
this file again in every rank (as ``__mp_main__``), so they exist there too.
Every other flag is ``disttrain bench allreduce``'s; the table is its table.
"""

from __future__ import annotations

import argparse
import sys

from disttrain.collectives.base import register
from disttrain.collectives.roundrobin import RoundRobin
from disttrain.lab import bench_allreduce


@register
class OneRound(RoundRobin):
    """One round at a time: post, wait, sum (what roundrobin did before)."""

    name = "roundrobin_depth1"
    depth = 1


@register
class AllRounds(RoundRobin):
    """Every round posted at once (n-1 receive buffers in the reduce-scatter)."""

    name = "roundrobin_all"
    depth = 1 << 16


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench_allreduce.add_arguments(parser)
    parser.set_defaults(algorithms="native,roundrobin_depth1,roundrobin,roundrobin_all")
    return bench_allreduce.run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
