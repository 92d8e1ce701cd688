"""``disttrain.train(config)`` inside a process group that someone else formed.

    GLOO_SOCKET_IFNAME=lo torchrun --nproc-per-node 2 --master-addr 127.0.0.1 \
        --master-port 29512 examples/train_api.py '{"epochs": 2}'

This script forms the gloo group itself (``torchrun``'s ``env://``), as Ray Train,
a Slurm step or a user's own program would, then hands it to disttrain: every
rank trains its part of the same job and gets rank 0's summary back. One JSON
line per rank: its place in the job and the summary's accuracy and run id.
"""

from __future__ import annotations

import json
import sys

import torch.distributed as dist

import disttrain as dt


def main() -> None:
    settings = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    dist.init_process_group("gloo")  # the engine's group: disttrain adopts it
    summary = dt.train(settings)
    line = {
        "rank": dt.rank(),
        "local_rank": dt.local_rank(),
        "local_size": dt.local_size(),
        "cross_rank": dt.cross_rank(),
        "cross_size": dt.cross_size(),
        "accuracy": summary["final_accuracy"],
        "run_id": summary["run_id"],
        "workers": summary["workers"],
    }
    print(json.dumps(line), flush=True)
    dist.destroy_process_group()  # the group is the script's: disttrain left it open


if __name__ == "__main__":
    main()
