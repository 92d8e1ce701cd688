"""Every action of a few GPipe steps on 2 stages, on one clock: where a stage's idle time goes.

    .venv/bin/python benchmarks/pipeline-third/trace_gpipe.py 8 3 1024 1024 [off]
    # M, steps, batch, width; "off": each receive posted only when needed

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


def work(a: argparse.Namespace, m: int, steps: int, ahead: bool) -> list[dict[str, Any]]:
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
    grid = schedule.build("gpipe", m, p)
    runner = PipelineRunner(parts[rank], rank, grid, meta, F.mse_loss, recv_ahead=ahead)
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


def _hand_offs(stages: list[dict[str, Any]]) -> None:
    """Each message's trip: from the sender's isend to the end of the receiver's wait.

    Stage 0's k-th send is micro-batch k's activation, taken by stage 1's k-th
    receive; stage 1's k-th send is gradient k, taken by stage 0's k-th receive.
    A trip time is known only for messages sent while their receiver was
    already waiting (then the end of the wait is the arrival).
    """
    for src, dst in ((0, 1), (1, 0)):
        sends = [(ts, dur) for name, ts, dur, _ in stages[src]["spans"] if name == "send"]
        recvs = [(ts, dur) for name, ts, dur, _ in stages[dst]["spans"] if name == "send/recv"]
        trips, waits = [], []
        for (s_ts, _s_dur), (r_ts, r_dur) in zip(sends, recvs, strict=False):
            waits.append(r_dur)
            if r_ts <= s_ts:  # the receiver waited before the send was posted
                trips.append(r_ts + r_dur - s_ts)
        trips.sort()
        if waits:
            known = (f"; {len(trips)} sent to a waiting receiver, post-to-arrival median "
                     f"{trips[len(trips) // 2] * 1e3:.3f} ms, max {trips[-1] * 1e3:.3f} ms"
                     if trips else "")  # fmt: skip
            print(f" stage {src} -> {dst}: {len(waits)} receives, waited "
                  f"{sum(waits) * 1e3:.2f} ms in all{known}")  # fmt: skip


def _measured(stages: list[dict[str, Any]], window: float) -> float:
    return sum(1 - s["times"]["compute"] / window for s in stages) / len(stages)


def _instant_hand_offs(stages: list[dict[str, Any]]) -> float:
    """The idle share if every message arrived the moment it was sent.

    Replays each stage's actions in its order with their measured durations:
    F(m) on s starts when s is free and F(m) on s-1 has ended; B(m) on s when s
    is free and B(m) on s+1 has ended. What this leaves above the formula is
    the stages' unequal measured compute; what the measured share has above
    this is communication (waits, posting, late wake-ups).
    """
    acts = [[(n, a["microbatch"], d) for n, _, d, a in s["spans"] if n in ("forward", "backward")]
            for s in stages]  # fmt: skip
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * len(stages)
    nxt = [0] * len(stages)
    while any(nxt[s] < len(acts[s]) for s in range(len(stages))):
        for s in range(len(stages)):
            if nxt[s] >= len(acts[s]):
                continue
            name, mb, dur = acts[s][nxt[s]]
            dep = ("forward", mb, s - 1) if name == "forward" else ("backward", mb, s + 1)
            if 0 <= dep[2] < len(stages) and dep not in done:
                continue  # its input is not computed yet
            start = max(free[s], done.get(dep, 0.0))
            free[s] = done[(name, mb, s)] = start + dur
            nxt[s] += 1
    window = max(free)
    return sum(1 - sum(d for *_, d in a) / window for a in acts) / len(acts)


if __name__ == "__main__":
    m, steps = int(sys.argv[1]), int(sys.argv[2])
    batch, width = int(sys.argv[3]), int(sys.argv[4])
    ahead = sys.argv[5:6] != ["off"]  # "off": post each receive only when it is needed
    res = bp._spawn(work, 2, (argparse.Namespace(width=width, batch=batch), m, steps, ahead))
    print(
        f"GPipe M={m} P=2, 2 x Linear({width}) per stage, batch {batch}, receives posted "
        f"{'one action early' if ahead else 'when needed'}  ({time.ctime()})"
    )
    for i in range(steps):
        stages = [r[i] for r in res]
        t0 = min(s["times"]["start"] for s in stages)
        window = max(s["times"]["end"] for s in stages) - t0
        print(f"--- step {i}: window {window * 1e3:.2f} ms")
        for rank, s in enumerate(stages):
            t = s["times"]
            idle = 1 - t["compute"] / window
            fwd = sum(d for n, _, d, _ in s["spans"] if n == "forward")
            bwd = sum(d for n, _, d, _ in s["spans"] if n == "backward")
            print(f" stage {rank}: forwards {fwd * 1e3:.2f} ms, backwards {bwd * 1e3:.2f} ms")
            print(f" stage {rank}: compute {t['compute'] * 1e3:.2f} ms "
                  f"(CPU {t['compute_cpu'] * 1e3:.2f})  comm {t['comm'] * 1e3:.2f}  "
                  f"idle share of window {idle:.3f}")  # fmt: skip
            for name, ts, dur, args in s["spans"]:
                tag = args.get("microbatch", args.get("peer_stage", ""))
                # timeline spans use time.monotonic_ns, the same clock as StepTimes.start
                print(f"    {name:<10}{tag!s:>3} @{(ts - t0) * 1e3:8.3f} {dur * 1e3:7.3f}")
        _hand_offs(stages)
        sim = _instant_hand_offs(stages)
        got = _measured(stages, window)
        print(f" the same actions' measured durations with instant hand-offs: idle share "
              f"{sim:.3f} (formula {1 / (m + 1):.3f}, measured {got:.3f})")  # fmt: skip
