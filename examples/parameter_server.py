"""Parameter server: 4 workers, 2 sharded servers, asynchronous SGD, one straggler.

    PYTHONPATH=src python examples/parameter_server.py

is the same as the command line

    disttrain train --strategy ps --ps-mode async --staleness-lr --workers 4 --servers 2 \\
        --straggler 3:4 --model cnn --optimizer sgd --lr 0.1 --epochs 5

Other modes: ``--ps-mode sync`` (equal to ``--strategy allreduce``), ``--ps-mode ssp
--staleness-bound 2`` (no worker more than 2 steps ahead of the slowest),
``--ps-mode softsync --softsync 2`` (every update averages 2 gradients).
summary.json then holds staleness_mean, staleness_max, staleness_histogram,
clock_gap_histogram, per_server bytes in/out and any lost_workers.
"""

from __future__ import annotations

import sys

from disttrain.cli import main

ARGS = [
    "train",
    "--strategy",
    "ps",
    "--ps-mode",
    "async",
    "--staleness-lr",
    "--workers",
    "4",
    "--servers",
    "2",
    "--straggler",
    "3:4",
    "--model",
    "cnn",
    "--optimizer",
    "sgd",
    "--lr",
    "0.1",
    "--epochs",
    "5",
]

if __name__ == "__main__":
    sys.exit(main([*ARGS, *sys.argv[1:]]))
