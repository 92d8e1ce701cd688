"""GPipe on 2 processes: an MLP split into 2 stages, 4 micro-batches, equal to one process.

PYTHONPATH=src python examples/pipeline_gpipe.py  # [more train flags, which win]
# the same through the CLI:
disttrain train --strategy pipeline --workers 2 --schedule gpipe --microbatches 4
"""

from __future__ import annotations

import sys

from disttrain.cli import main
from disttrain.parallel.pipeline.schedule import gpipe, render

ARGS = [
    "train",
    "--strategy",
    "pipeline",
    "--workers",
    "2",
    "--schedule",
    "gpipe",
    "--microbatches",
    "4",
    "--epochs",
    "2",
    "--no-progress",
]

if __name__ == "__main__":
    print(render(gpipe(4, 2)), end="\n\n")  # what each stage does at each tick
    sys.exit(main([*ARGS, *sys.argv[1:]]))  # flags given here come later: they win
