"""Pipeline receives posted one action ahead vs when needed, against torch's schedule.

    disttrain bench pipeline-recv-ahead 1f1b 16 20 [width batch]

Schedule, micro-batches M, rounds; P = 2 stages of 2 x Linear(width), batch
rows. This is the measurement behind ``recv_ahead_default`` in
``parallel/pipeline/runner.py`` (1F1B posts when needed, GPipe ahead). All
three run in the same 2 processes, one step each per round, the order
rotating from round to round; ``paired`` = median over rounds of a variant's
step over torch's in the same round (``bench_tensor.summarize``).
"""

from __future__ import annotations

import argparse
import copy
import functools
import time
from collections.abc import Callable
from typing import Any

from disttrain.comm.errors import UsageError

__all__ = ["add_arguments", "run", "work"]


def work(a: argparse.Namespace, sched: str, m: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.nn import functional as F

    from disttrain.lab.bench import _tensor as bench_tensor
    from disttrain.lab.bench import pipeline as bp
    from disttrain.parallel import placement
    from disttrain.parallel.pipeline import schedule
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
        steps[name] = functools.partial(runner.run, x, y)
    parts = placement.split(bp._model(p, a.layers_per_stage, a.width), sizes)
    stage = PipelineStage(parts[rank], rank, p, torch.device("cpu"))
    sch = schedule.torch_schedule_class(sched)(stage, m, loss_fn=F.mse_loss)
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
        {"on-demand": times["on-demand"], "ahead": times["ahead"]},
        {"on-demand": 0, "ahead": 0},
        anchor="ahead",
    )["on-demand"]["paired"]
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("schedule", choices=("gpipe", "1f1b"))
    parser.add_argument("microbatches", type=int, help="M")
    parser.add_argument("rounds", type=int, help="timed rounds (after 2 untimed)")
    parser.add_argument("width", type=int, nargs="?", default=512, help="default: 512")
    parser.add_argument("batch", type=int, nargs="?", default=128, help="default: 128")


def run(args: argparse.Namespace) -> int:
    from disttrain.lab.bench import pipeline as bp

    if args.microbatches < 1 or args.rounds < 1 or args.width < 1 or args.batch < 1:
        raise UsageError("microbatches, rounds, width and batch must be at least 1")
    sched, m, reps, width, batch = (
        args.schedule,
        args.microbatches,
        args.rounds,
        args.width,
        args.batch,
    )
    a = argparse.Namespace(layers_per_stage=2, width=width, batch=batch, repeats=reps)
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[0]
    r = bp._spawn(work, 2, (a, sched, m))[0]
    print(f"{sched} M={m} P=2 width {width} batch {batch}, {reps} rounds, load {load}:")
    for name, row in r.items():
        extra = "".join(f"  {k} {v:.3f}" for k, v in row.items() if k.startswith("paired"))
        print(f"  {name:<10} step {row['step'] * 1e3:7.2f} ms{extra}")
    return 0
