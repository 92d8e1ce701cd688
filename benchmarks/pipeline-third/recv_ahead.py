"""Our runner with each receive posted one action ahead vs posted when needed, and torch's schedule.

    .venv/bin/python benchmarks/pipeline-third/recv_ahead.py 1f1b 16 20 [width batch]

All three run in the same 2 processes, one step each per round, the order
rotating from round to round; ``paired`` = median over rounds of a variant's
step over torch's in the same round (``bench_tensor.summarize``).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from disttrain.lab import bench_pipeline as bp
from disttrain.lab import bench_tensor
from disttrain.parallel.pipeline import schedule


def work(a: argparse.Namespace, sched: str, m: int) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from torch.nn import functional as F

    from disttrain.parallel import placement
    from disttrain.parallel.pipeline.runner import PipelineRunner

    rank, p = dist.get_rank(), dist.get_world_size()
    sizes = [2 * a.layers_per_stage] * p
    grid = schedule.build(sched, m, p)
    steps: dict[str, Callable[[], object]] = {}
    x, y = torch.randn(a.batch, a.width), torch.randn(a.batch, a.width)
    for name, ahead in (("ahead", True), ("on-demand", False)):
        parts = placement.split(bp._model(p, a.layers_per_stage, a.width), sizes)
        meta = [copy.deepcopy(s).to("meta") for s in parts]
        runner = PipelineRunner(parts[rank], rank, grid, meta, F.mse_loss, recv_ahead=ahead)
        steps[name] = lambda r=runner: r.run(x, y)
    parts = placement.split(bp._model(p, a.layers_per_stage, a.width), sizes)
    stage = PipelineStage(parts[rank], rank, p, torch.device("cpu"))
    sch = (ScheduleGPipe if sched == "gpipe" else Schedule1F1B)(stage, m, loss_fn=F.mse_loss)
    steps["torch"] = (lambda: sch.step(x)) if rank == 0 else (lambda: sch.step(target=y, losses=[]))
    names = tuple(steps)
    times: dict[str, list[float]] = {n: [] for n in names}
    for i in range(a.repeats + 2):
        for name in bench_tensor.rotation(names, i):
            dist.barrier()
            t0 = time.perf_counter()
            steps[name]()
            dist.barrier()
            if i >= 2:
                times[name].append(time.perf_counter() - t0)
    out = bench_tensor.summarize(times, dict.fromkeys(names, 0.0), anchor="torch")
    # ours on-demand over ours ahead, round by round
    out["on-demand"]["paired_vs_ahead"] = bench_tensor.summarize(
        {"on-demand": times["on-demand"], "ahead": times["ahead"]}, {"on-demand": 0, "ahead": 0},
        anchor="ahead",
    )["on-demand"]["paired"]  # fmt: skip
    return out


if __name__ == "__main__":
    sched, m, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    width = int(sys.argv[4]) if len(sys.argv) > 4 else 512
    batch = int(sys.argv[5]) if len(sys.argv) > 5 else 128
    args = argparse.Namespace(layers_per_stage=2, width=width, batch=batch, repeats=reps)
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[0]
    r = bp._spawn(work, 2, (args, sched, m))[0]
    print(f"{sched} M={m} P=2 width {width} batch {batch}, {reps} rounds, load {load}:")
    for name, row in r.items():
        extra = "".join(f"  {k} {v:.3f}" for k, v in row.items() if k.startswith("paired"))
        print(f"  {name:<10} step {row['step'] * 1e3:7.2f} ms{extra}")
