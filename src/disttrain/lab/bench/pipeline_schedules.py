"""Interleaved and zero-bubble schedules: replayed bubble vs theory, step time vs torch's.

    disttrain bench pipeline-schedules --stages 2 --microbatches 4,8 --repeats 5

Part 1, the bubble: each schedule (``--schedules``) runs on P local processes
(gloo, one thread each); every rank records each action's measured seconds,
by default its CPU time (``time.thread_time``: on a loaded machine an action's
wall time also holds the spans in which the OS ran another process).
:func:`schedule.replay` lays those durations out with instant hand-offs: its
idle share is the schedule's bubble at the measured durations, free of the
machine's noise (on 2 shared cores the wall-clock bubble mostly measures the
scheduler). ``replay``: each action's median duration over the timed steps,
replayed once; ``per step``: each step's own durations replayed, median over
steps (one step's jitter included); ``at means``: every action of a kind given
the kind's mean duration (the schedule's bubble at this machine's F:B:W
ratio); ``theory``: the formula (every action one tick, F = B = W).

Part 2, step time: ours and torch.distributed.pipelining's anchors on the same
model, split the same way, in the same processes, one step of each per round
(order alternating), ``paired`` = median over rounds of ours / theirs:
interleaved vs ``ScheduleInterleaved1F1B`` (P·V stages, rank r holding r, r+P),
zb1 vs ``ScheduleInterleavedZeroBubble`` on the same P·V stages, and zb1 vs our
own 1F1B (P stages). An anchor that raises is recorded with its exact error.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from disttrain.comm.errors import UsageError
from disttrain.parallel.pipeline import SCHEDULES, schedule

__all__ = ["add_arguments", "run"]

ANCHORS = {
    "interleaved": "torch ScheduleInterleaved1F1B",
    "zero-bubble": "torch ScheduleInterleavedZeroBubble",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stages", type=int, default=2, help="pipeline ranks P (processes)")
    parser.add_argument("--microbatches", default="4,8", help="M values, comma-separated")
    parser.add_argument("--virtual-stages", type=int, default=2, help="V for interleaved")
    parser.add_argument("--schedules", default="1f1b,interleaved,zb1,zb2", help="ours, in order")
    parser.add_argument("--width", type=int, default=256, help="Linear width of every layer")
    parser.add_argument("--layers", type=int, default=8, help="Linear+ReLU pairs in the model")
    parser.add_argument("--batch", type=int, default=64, help="batch size per step")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps (rounds)")
    parser.add_argument("--skip-torch", action="store_true", help="leave out the torch anchors")
    parser.add_argument(
        "--wall", dest="cpu", action="store_false",
        help="replay each action's wall time (default: its CPU time, free of preemptions)",
    )  # fmt: skip


def _model(a: argparse.Namespace) -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(a.layers):
        layers += [nn.Linear(a.width, a.width), nn.ReLU()]
    return nn.Sequential(*layers)


def _parts(a: argparse.Namespace, cuts: int) -> list[nn.Sequential]:
    from disttrain.parallel import placement

    return placement.split(_model(a), [2 * a.layers // cuts] * cuts)


def _runner(a: argparse.Namespace, name: str, m: int) -> Any:
    import torch.distributed as dist
    from torch.nn import functional as F

    from disttrain.parallel.pipeline.runner import PipelineRunner, recv_ahead_default

    rank, p = dist.get_rank(), dist.get_world_size()
    v = a.virtual_stages if SCHEDULES.get(name).virtual else 1
    parts = _parts(a, p * v)
    meta = [copy.deepcopy(s).to("meta") for s in parts]
    grid = schedule.build(name, m, p, v)
    return PipelineRunner(parts[rank::p], rank, grid, meta, F.mse_loss,
                          recv_ahead=recv_ahead_default(name))  # fmt: skip


def _timed(step: Callable[[], object]) -> float:
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    step()
    dist.barrier()
    return time.perf_counter() - t0


def _replays(a: argparse.Namespace, names: list[str], m: int) -> dict[str, Any]:
    """Each schedule's actions, measured on this rank, per timed step."""
    out: dict[str, Any] = {}
    x, y = torch.randn(a.batch, a.width), torch.randn(a.batch, a.width)
    for name in names:
        runner = _runner(a, name, m)
        steps, times = [], []
        for i in range(a.repeats + 2):
            t = _timed(lambda: runner.run(x, y))  # noqa: B023 (called at once)
            if i >= 2:
                steps.append(list(runner.times.actions_cpu if a.cpu else runner.times.actions))
                times.append(t)
        out[name] = {"actions": steps, "step": statistics.median(times),
                     "peak": runner.activations.peak}  # fmt: skip
    return out


def _bubble_rows(
    per_rank: list[dict[str, Any]], names: list[str], m: int, p: int, v: int
) -> list[dict[str, Any]]:
    rows = []
    for name in names:
        kind = SCHEDULES.get(name)
        vv = v if kind.virtual else 1
        idles, means = [], []
        for step in zip(*(r[name]["actions"] for r in per_rank), strict=True):
            window, busy = schedule.replay([list(s) for s in step], virtual=vv)
            idles.append(statistics.mean(1 - b / window for b in busy))
            means.append(_kind_means(step))
        mean = {k: statistics.median(d[k] for d in means) for k in means[0]}
        # each action's median over the steps (per rank, per position): one step's jitter out,
        # the stages' and actions' own differences kept
        medians = [
            [(k, mb, statistics.median(st[i][2] for st in r[name]["actions"]))
             for i, (k, mb, _) in enumerate(r[name]["actions"][0])]
            for r in per_rank
        ]  # fmt: skip
        window, busy = schedule.replay(medians, virtual=vv)
        per_action = statistics.mean(1 - b / window for b in busy)
        step0 = [list(r[name]["actions"][0]) for r in per_rank]
        window, busy = schedule.replay(
            [[(k, mb, mean[k[0]]) for k, mb, _ in s] for s in step0], virtual=vv
        )
        at_means = statistics.mean(1 - b / window for b in busy)
        rows.append({
            "schedule": name, "m": m, "theory": kind.bubble(m, p, vv),
            "replay_means": at_means, "replay_per_step": statistics.median(idles),
            "replay_measured": per_action,
            "durations": mean, "step": per_rank[0][name]["step"],
            "peak_activation_bytes": [r[name]["peak"] for r in per_rank],
        })  # fmt: skip
    return rows


def _kind_means(step: tuple[list[tuple[str, int, float]], ...]) -> dict[str, float]:
    """Mean seconds of each action kind (F, B, W) over all ranks of one step."""
    by: dict[str, list[float]] = {}
    for acts in step:
        for k, _, sec in acts:
            by.setdefault(k[0], []).append(sec)
    return {k: statistics.mean(v) for k, v in by.items()}


def _torch_schedule(a: argparse.Namespace, which: str, m: int) -> tuple[Callable[[], None], int]:
    """A step of torch's ``which`` schedule on P·V stages, rank r holding r, r+P, ..."""
    import torch.distributed as dist
    from torch.distributed.pipelining import (
        PipelineStage,
        ScheduleInterleaved1F1B,
        ScheduleInterleavedZeroBubble,
    )
    from torch.nn import functional as F

    rank, p = dist.get_rank(), dist.get_world_size()
    v = a.virtual_stages
    parts = _parts(a, p * v)
    stages = [PipelineStage(parts[s], s, p * v, torch.device("cpu")) for s in range(rank, p * v, p)]
    cls = ScheduleInterleaved1F1B if which == "interleaved" else ScheduleInterleavedZeroBubble
    sch = cls(stages, m, loss_fn=F.mse_loss)  # type: ignore[arg-type]
    x, y = torch.randn(a.batch, a.width), torch.randn(a.batch, a.width)

    def step() -> None:
        if rank == 0:
            sch.step(x, target=y if p == 1 else None)
        elif rank == p - 1:
            sch.step(target=y, losses=[])
        else:
            sch.step()

    return step, v


def _paired(a: argparse.Namespace, ours: str, theirs: str, m: int) -> dict[str, Any]:
    """Paired rounds of our ``ours`` against ``theirs`` (a torch schedule or ``our:NAME``)."""
    x, y = torch.randn(a.batch, a.width), torch.randn(a.batch, a.width)
    runner = _runner(a, ours, m)
    try:
        if theirs.startswith("our:"):
            anchor = _runner(a, theirs[4:], m)
            other: Callable[[], object] = lambda: anchor.run(x, y)  # noqa: E731
        else:
            other, _ = _torch_schedule(a, theirs, m)
            other()  # one step outside the timing: it raises here if it cannot run on gloo
    except Exception as exc:  # the anchor's own failure is the result to record
        return {"error": f"{type(exc).__name__}: {exc}"}
    o_t, t_t = [], []
    for i in range(a.repeats + 2):
        if i % 2 == 0:
            o, t = _timed(lambda: runner.run(x, y)), _timed(other)
        else:
            t, o = _timed(other), _timed(lambda: runner.run(x, y))
        if i >= 2:
            o_t.append(o)
            t_t.append(t)
    return {"ours": statistics.median(o_t), "theirs": statistics.median(t_t),
            "paired": statistics.median(o / t for o, t in zip(o_t, t_t, strict=True))}  # fmt: skip


def _spawn(fn: Callable[..., Any], size: int, args: tuple[Any, ...]) -> list[Any]:
    from disttrain.launch.spawn import run_world

    return run_world(fn, size, args, timeout=600, collective_timeout=120)


def run(a: argparse.Namespace) -> int:
    try:
        ms = [int(v) for v in a.microbatches.split(",")]
    except ValueError:
        raise UsageError(f"--microbatches {a.microbatches!r}: use numbers like 4,8") from None
    names = a.schedules.split(",")
    for name in names:
        SCHEDULES.get(name)  # an unknown name: one line
    p, v = a.stages, a.virtual_stages
    if not 2 <= p <= 4:
        raise UsageError(f"--stages {p}: this benchmark starts P local processes, use 2 to 4")
    if a.layers % (p * v) or any(a.batch % m or m % p for m in ms):
        raise UsageError(
            f"--layers {a.layers} must split into {p}x{v} stages and every M must divide "
            f"--batch {a.batch} and be a multiple of --stages {p}"
        )
    print(f"P={p}, V={v}, {a.layers} x Linear({a.width})+ReLU, batch {a.batch}, "
          f"median of {a.repeats} steps")  # fmt: skip
    print(f"{'schedule':<12}{'M':>3} {'theory':>7} {'replay':>7} {'rel.err':>8} "
          f"{'per step':>9} {'at means':>9}  F/B/W ms{'':<14}{'step s':>7}  "
          "peak activations")  # fmt: skip
    for m in ms:
        per_rank = _spawn(_replays, p, (a, names, m))
        for row in _bubble_rows(per_rank, names, m, p, v):
            err = (row["replay_measured"] - row["theory"]) / row["theory"]
            dur = "/".join(
                f"{row['durations'][k] * 1e3:.2f}" for k in "FBW" if k in row["durations"]
            )
            print(f"{row['schedule']:<12}{m:>3} {row['theory']:>7.3f} "
                  f"{row['replay_measured']:>7.3f} {err:>+8.1%} {row['replay_per_step']:>9.3f} "
                  f"{row['replay_means']:>9.3f}  "
                  f"{dur:<22}{row['step']:>7.4f}  {row['peak_activation_bytes']}")  # fmt: skip
    if a.skip_torch:
        return 0
    m = max(ms)
    print(f"\nStep time at M={m}, paired rounds (ratio < 1: ours faster)")
    pairs = [("interleaved", "interleaved"), ("zb1", "zero-bubble"), ("zb1", "our:1f1b"),
             ("zb2", "our:1f1b")]  # fmt: skip
    for ours, theirs in pairs:
        r = _spawn(_paired, p, (a, ours, theirs, m))[0]
        label = ANCHORS.get(theirs, theirs)
        if "error" in r:
            print(f"  {ours:<12} vs {label}: anchor failed: {r['error']}")
        else:
            print(f"  {ours:<12} vs {label}: ours {r['ours']:.4f} s, theirs {r['theirs']:.4f} s, "
                  f"paired {r['paired']:.2f}")  # fmt: skip
    return 0
