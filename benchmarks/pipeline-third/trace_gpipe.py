"""Every action of a few GPipe steps on 2 stages, on one clock: where a stage's idle time goes.

    .venv/bin/python benchmarks/pipeline-third/trace_gpipe.py 8 3 1024 1024  # M steps batch width

Equal stages as in ``disttrain bench pipeline`` (stage 0's micro-batch inputs
require a gradient). After 3 warm-up steps, each traced step prints, per stage: the
runner's StepTimes (compute wall and CPU time, comm), its idle share of the
common window (first start to last end), and every timeline span (receive
waits ``send/recv``, ``forward``, ``backward``, ``send`` posting, the final
``send wait``) as offset and duration in ms from the window's start.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from typing import Any

import torch

from disttrain.lab import bench_pipeline as bp
from disttrain.parallel.pipeline import schedule


def work(a: argparse.Namespace, m: int, steps: int) -> list[dict[str, Any]]:
    import torch.distributed as dist
    from torch.nn import functional as F

    from disttrain import timeline
    from disttrain.parallel import placement
    from disttrain.parallel.pipeline.runner import PipelineRunner

    rank, p = dist.get_rank(), dist.get_world_size()
    parts = placement.split(bp._model(p, 2, a.width), [4] * p)
    meta = [copy.deepcopy(s).to("meta") for s in parts]
    if rank == 0:
        parts[0] = torch.nn.Sequential(bp._InputGrad(), parts[0])
    runner = PipelineRunner(parts[rank], rank, schedule.build("gpipe", m, p), meta, F.mse_loss)
    x, y = torch.randn(a.batch, a.width), torch.randn(a.batch, a.width)
    for _ in range(3):
        dist.barrier()
        runner.run(x, y)
    out = []
    for _ in range(steps):
        dist.barrier()
        rec = timeline.start(rank)
        runner.run(x, y)
        timeline.stop()
        dist.barrier()
        spans = [(e["name"], e["ts"] / 1e9, e["dur"] / 1e9, e.get("args", {})) for e in rec.events]
        out.append({"times": dict(vars(runner.times)), "spans": spans})
    return out


if __name__ == "__main__":
    m, steps = int(sys.argv[1]), int(sys.argv[2])
    batch, width = int(sys.argv[3]), int(sys.argv[4])
    res = bp._spawn(work, 2, (argparse.Namespace(width=width, batch=batch), m, steps))
    print(f"GPipe M={m} P=2, 2 x Linear({width}) per stage, batch {batch}  ({time.ctime()})")
    for i in range(steps):
        stages = [r[i] for r in res]
        t0 = min(s["times"]["start"] for s in stages)
        window = max(s["times"]["end"] for s in stages) - t0
        print(f"--- step {i}: window {window * 1e3:.2f} ms")
        for rank, s in enumerate(stages):
            t = s["times"]
            idle = 1 - t["compute"] / window
            print(f" stage {rank}: compute {t['compute'] * 1e3:.2f} ms "
                  f"(CPU {t['compute_cpu'] * 1e3:.2f})  comm {t['comm'] * 1e3:.2f}  "
                  f"idle share of window {idle:.3f}")  # fmt: skip
            for name, ts, dur, args in s["spans"]:
                tag = args.get("microbatch", args.get("peer_stage", ""))
                # timeline spans use time.monotonic_ns, the same clock as StepTimes.start
                print(f"    {name:<10}{tag!s:>3} @{(ts - t0) * 1e3:8.3f} {dur * 1e3:7.3f}")
