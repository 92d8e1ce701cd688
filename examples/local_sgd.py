"""Local SGD: 4 workers step alone and average their parameters every 16 steps.

    PYTHONPATH=src python examples/local_sgd.py
    # the same from the CLI:
    disttrain train --workers 4 --strategy localsgd --period 16 --epochs 10
    # post-local SGD (synchronous first), and averaging the momentum buffers too:
    disttrain train --workers 4 --strategy localsgd --period 16 --warmup-sync-steps 20 \\
        --average-optimizer-state

Sends 16x fewer bytes than ``--strategy allreduce`` (see docs/compression.md).
"""

from __future__ import annotations

import sys

from disttrain.cli import main

ARGS = ["--workers", "4", "--strategy", "localsgd", "--period", "16", "--epochs", "10"]

if __name__ == "__main__":
    sys.exit(main(["train", *ARGS, *sys.argv[1:]]))
