"""Megatron-style tensor slicing on 2 processes: each holds half of every hidden layer.

PYTHONPATH=src python examples/tensor_parallel.py  # [more train flags, which win]
# the seed's naive vertical split (one all-gather per layer), to compare the bytes sent:
disttrain train --strategy tensor --workers 2 --tensor-mode naive --epochs 2
"""

from __future__ import annotations

import sys

from disttrain.cli import main

ARGS = [
    "train",
    "--strategy",
    "tensor",
    "--workers",
    "2",
    "--tensor-mode",
    "megatron",
    "--epochs",
    "2",
    "--no-progress",
]

if __name__ == "__main__":
    sys.exit(main([*ARGS, *sys.argv[1:]]))  # flags given here come later: they win
