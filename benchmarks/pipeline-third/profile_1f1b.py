"""Where a step of ours and of torch.distributed.pipelining goes: compute vs p2p waits vs the rest.

    .venv/bin/python benchmarks/pipeline-third/profile_1f1b.py 1f1b 16 20

Both run in the same 2 processes, rounds alternating which goes first (as in
``disttrain bench pipeline``). Ours: the runner's StepTimes (compute = the
forward/backward calls, comm = receive waits and send posting). Torch: the
time inside ``forward_one_chunk``/``backward_one_chunk`` (compute) and inside
``_wait_batch_p2p`` (waits), by wrapping them; "other" is the rest of the step
(scheduling, building p2p ops, loss bookkeeping); "barrier to barrier" is
the step as the bench times it (up to the barrier after it). Medians over
rounds, in ms.
"""

from __future__ import annotations

import argparse
import copy
import functools
import statistics
import sys
import time
from typing import Any

import torch

from disttrain.lab import bench_pipeline as bp
from disttrain.parallel.pipeline import schedule


def work(a: argparse.Namespace, sched: str, m: int) -> dict[str, Any]:
    import torch.distributed as dist
    import torch.distributed.pipelining.schedules as schmod
    import torch.distributed.pipelining.stage as stmod
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from torch.nn import functional as F

    from disttrain.parallel import placement
    from disttrain.parallel.pipeline.runner import PipelineRunner, recv_ahead_default

    acc = {"compute": 0.0, "wait": 0.0}

    def timed_into(key: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                acc[key] += time.perf_counter() - t0

        return wrapper

    base = stmod._PipelineStageBase
    base.forward_one_chunk = timed_into("compute", base.forward_one_chunk)  # type: ignore[method-assign]
    base.backward_one_chunk = timed_into("compute", base.backward_one_chunk)  # type: ignore[method-assign]
    schmod._wait_batch_p2p = timed_into("wait", schmod._wait_batch_p2p)

    rank, p = dist.get_rank(), dist.get_world_size()
    sizes = [2 * a.layers_per_stage] * p
    ours_parts = placement.split(bp._model(p, a.layers_per_stage, a.width), sizes)
    meta = [copy.deepcopy(s).to("meta") for s in ours_parts]
    grid = schedule.build(sched, m, p)
    ahead = recv_ahead_default(sched)  # as the strategy and the bench run it
    runner = PipelineRunner(ours_parts[rank], rank, grid, meta, F.mse_loss, recv_ahead=ahead)
    parts = placement.split(bp._model(p, a.layers_per_stage, a.width), sizes)
    stage = PipelineStage(parts[rank], rank, p, torch.device("cpu"))
    sch = (ScheduleGPipe if sched == "gpipe" else Schedule1F1B)(stage, m, loss_fn=F.mse_loss)
    x, y = torch.randn(a.batch, a.width), torch.randn(a.batch, a.width)

    def step(name: str) -> tuple[float, float, float]:
        dist.barrier()
        acc["compute"] = acc["wait"] = 0.0
        t0 = time.perf_counter()
        if name == "ours":
            runner.run(x, y)
        elif rank == 0:
            sch.step(x)
        else:
            sch.step(target=y, losses=[])
        t = time.perf_counter() - t0
        dist.barrier()
        between = time.perf_counter() - t0  # as the bench times it: barrier to barrier
        if name == "ours":
            return t, runner.times.compute, runner.times.comm, between
        return t, acc["compute"], acc["wait"], between

    rows: dict[str, list[tuple[float, float, float, float]]] = {"ours": [], "torch": []}
    for i in range(a.repeats + 2):
        for name in ("ours", "torch") if i % 2 == 0 else ("torch", "ours"):
            row = step(name)
            if i >= 2:
                rows[name].append(row)

    def med(v: list[float]) -> float:
        return round(statistics.median(v) * 1e3, 2)

    return {
        name: {
            "step": med([r[0] for r in v]),
            "compute": med([r[1] for r in v]),
            "wait": med([r[2] for r in v]),
            "other": med([r[0] - r[1] - r[2] for r in v]),
            "barrier to barrier": med([r[3] for r in v]),
        }
        for name, v in rows.items()
    }


if __name__ == "__main__":
    sched, m, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    args = argparse.Namespace(layers_per_stage=2, width=512, batch=128, repeats=reps)
    print(f"{sched} M={m} P=2, width 512, batch 128, median of {reps} rounds (ms)")
    for rank, r in enumerate(bp._spawn(work, 2, (args, sched, m))):
        for name, row in r.items():
            cells = "  ".join(f"{k} {v:7.2f}" for k, v in row.items())
            print(f"  rank {rank} {name:<6} {cells}")
