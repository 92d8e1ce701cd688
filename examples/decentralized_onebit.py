"""Decentralized SGD with Strom's one-bit threshold quantization and error feedback.

    PYTHONPATH=src python examples/decentralized_onebit.py
    # the same from the CLI:
    disttrain train --workers 4 --strategy decentralized --compression onebit:0.03 \\
        --optimizer sgd --lr 0.5 --epochs 10
    # ring neighbours only (CHOCO gossip; tau is then in parameter units):
    disttrain train --workers 4 --strategy decentralized --topology ring \\
        --compression onebit:0.015 --optimizer sgd --lr 0.5

Every worker sends the entries of (residual + gradient) beyond ±tau to every
peer as entropy-coded indices and sign bits; summary.json reports the
compression ratio actually achieved and the bits per sent entry.
"""

from __future__ import annotations

import sys

from disttrain.cli import main

ARGS = [
    "--workers",
    "4",
    "--strategy",
    "decentralized",
    "--compression",
    "onebit:0.03",
    "--optimizer",
    "sgd",
    "--lr",
    "0.5",
    "--epochs",
    "10",
]

if __name__ == "__main__":
    sys.exit(main(["train", *ARGS, *sys.argv[1:]]))
