"""Pipeline bubble vs (P-1)/(M+P-1); our schedules vs torch pipelining; tensor slicing vs DTensor.

    disttrain bench pipeline --show-schedule --stages 4 --microbatches 8
    disttrain bench pipeline --stages 2 --repeats 7 --out benchmarks/pipeline

Each part starts its own P local processes (gloo, one thread each) on a file
store. Step times are medians over ``--repeats`` timed steps after two warm-up
steps, measured on rank 0 between barriers; ours and the anchor run in the
same processes, in an order that alternates from step to step, and ``paired``
is the median over rounds of ours over the anchor's in the same round.

The bubble (:func:`bubble`) of a step is each stage's idle share of the
pipeline's step, 1 - compute_s / (last stage's end - first stage's start),
averaged over the stages: the formula's definition, where every stage's time
runs to the end of the step. It also holds the time spent waiting in p2p and
the time a peer was not scheduled while computing (``preempted``: wall minus
CPU time of the compute), which the formula leaves out. The first pass's
figure, each stage's idle share of its *own* step (ending at its last send),
is kept as ``own_step``. Stage 0's micro-batch inputs require a gradient here, so every
stage's backward computes an input gradient (equal stages).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from disttrain.comm.errors import UsageError
from disttrain.lab.bench import _tensor as bench_tensor
from disttrain.parallel.pipeline import schedule

if TYPE_CHECKING:
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    from disttrain.parallel.pipeline.runner import PipelineRunner

__all__ = ["add_arguments", "bubble", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stages", type=int, default=2, help="pipeline stages = processes")
    parser.add_argument("--microbatches", default="1,2,4,8,16", help="M values, comma-separated")
    parser.add_argument("--width", type=int, default=512, help="Linear width of every layer")
    parser.add_argument("--layers-per-stage", type=int, default=2, help="Linear+ReLU per stage")
    parser.add_argument("--batch", type=int, default=128, help="batch size per step")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per measurement")
    parser.add_argument("--show-schedule", action="store_true", help="print the diagrams, exit")
    parser.add_argument(
        "--schedule",
        default="gpipe,1f1b",
        help="--show-schedule: the schedules to draw (any of gpipe, 1f1b, interleaved, zb1, zb2)",
    )
    parser.add_argument("--virtual-stages", type=int, default=2, help="V of --schedule interleaved")
    parser.add_argument("--skip-torch", action="store_true", help="leave out the torch anchors")
    parser.add_argument("--bubble-only", action="store_true", help="measure the bubble only")
    parser.add_argument("--out", default="", help="folder for results.json and bubble.png")
    parser.add_argument(
        "--recv-ahead",
        choices=("auto", "on", "off"),
        default="auto",
        help="post each receive one action early (auto: the runner's default for the schedule)",
    )
    parser.add_argument(
        "--unequal",
        action="store_true",
        help="bubble: leave stage 0's input without a gradient (its backward then does less)",
    )


def _model(stages: int, per_stage: int, width: int) -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(stages * per_stage):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def _recv_ahead(a: argparse.Namespace, sched: str) -> bool:
    from disttrain.parallel.pipeline.runner import recv_ahead_default

    how = getattr(a, "recv_ahead", "auto")
    return recv_ahead_default(sched) if how == "auto" else how == "on"


class _InputGrad(nn.Module):
    """Makes each micro-batch's input a leaf that needs a gradient, so the first Linear's
    backward computes its input gradient like every later stage's (and only that: a
    gradient for the whole batch's ``x`` would also add every micro-batch's into it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.detach().requires_grad_(torch.is_grad_enabled())


def _spawn(fn: Callable[..., Any], size: int, args: tuple[Any, ...]) -> list[Any]:
    """Run ``fn(*args)`` on ``size`` fresh processes; their results by rank."""
    from disttrain.launch.spawn import run_world

    return run_world(fn, size, args, timeout=600, collective_timeout=120)


def _time_steps(step: Callable[[], None], repeats: int) -> list[float]:
    import torch.distributed as dist

    times = []
    for i in range(repeats + 2):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        dist.barrier()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return times


def _ours(a: argparse.Namespace, sched: str, m: int) -> dict[str, Any]:
    """Our runner: each timed step's StepTimes on this stage, peak saved-activation bytes."""
    import copy

    import torch.distributed as dist
    from torch.nn import functional as F

    from disttrain.parallel import placement
    from disttrain.parallel.pipeline.runner import PipelineRunner

    rank, p = dist.get_rank(), dist.get_world_size()
    model = _model(p, a.layers_per_stage, a.width)
    parts = placement.split(model, [2 * a.layers_per_stage] * p)
    meta = [copy.deepcopy(s).to("meta") for s in parts]
    if rank == 0 and not getattr(a, "unequal", False):
        # equal stages: stage 0's backward then computes its input gradient, as every other's does
        parts[0] = nn.Sequential(_InputGrad(), parts[0])
    runner = PipelineRunner(
        parts[rank],
        rank,
        schedule.build(sched, m, p),
        meta,
        F.mse_loss,
        recv_ahead=_recv_ahead(a, sched),
    )
    x, y = torch.randn(a.batch, a.width), torch.randn(a.batch, a.width)
    steps: list[dict[str, float]] = []

    def step() -> None:
        runner.run(x, y)
        steps.append(dict(vars(runner.times)))

    times = _time_steps(step, a.repeats)
    return {"step": statistics.median(times), "steps": steps[2:], "peak": runner.activations.peak}


def bubble(per_rank: list[list[dict[str, float]]]) -> dict[str, float]:
    """The measured bubble from every rank's StepTimes fields (``per_rank[r][step]``).

    For each step, the pipeline's step is ``window`` = the latest ``end`` minus
    the earliest ``start`` (monotonic clock, one per host); a stage's idle share
    is 1 - compute / window, averaged over the stages; the figures are medians
    over the steps. ``own_step`` is the earlier measure (each stage's idle share
    of its own step); ``preempted`` the share of the window in which a stage
    was computing but not running (wall minus CPU time), averaged over stages;
    ``instant_hand_offs`` the idle share of the same actions' measured durations
    replayed with instant hand-offs (:func:`schedule.replay`): above the formula
    by the stages' unequal compute only.
    """
    rows = []
    for step in zip(*per_rank, strict=True):
        window = max(t["end"] for t in step) - min(t["start"] for t in step)
        idle = [1.0 - t["compute"] / window for t in step]
        own = [1.0 - t["compute"] / t["step"] for t in step]
        lost = [max(0.0, t["compute"] - t["compute_cpu"]) / window for t in step]
        # the same actions' measured durations, hand-offs instant: the stages' inequality alone
        ideal, busy = schedule.replay([list(t["actions"]) for t in step])
        instant = statistics.mean(1.0 - b / ideal for b in busy) if ideal > 0 else 0.0
        rows.append(
            (statistics.mean(idle), statistics.mean(own), statistics.mean(lost), window, instant)
        )
    med = [statistics.median(col) for col in zip(*rows, strict=True)]
    return {
        "measured": med[0],
        "own_step": med[1],
        "preempted": med[2],
        "window": med[3],
        "instant_hand_offs": med[4],
    }


def _torch_pipe(a: argparse.Namespace, sched: str, m: int) -> dict[str, Any]:
    """Ours and the anchor, torch.distributed.pipelining, on the same stages and micro-batches.

    Both run in the same processes, one step of each per round, ours first in
    even rounds and torch first in odd ones (neither always follows the
    other's step), so that both see the same load; ``paired`` is the median
    over rounds of our step time over torch's in the same round.
    """
    import torch.distributed as dist

    rank, p = dist.get_rank(), dist.get_world_size()
    runner = _our_runner(a, sched, m, rank, p)
    sch = _torch_schedule(a, sched, m, rank, p)
    x, y = torch.randn(a.batch, a.width), torch.randn(a.batch, a.width)

    def theirs() -> None:
        if rank == 0:
            sch.step(x)
        elif rank == p - 1:
            sch.step(target=y, losses=[])
        else:
            sch.step()

    ours_t, torch_t = _alternate_rounds(a.repeats, lambda: runner.run(x, y), theirs)
    ratios = [o / t for o, t in zip(ours_t, torch_t, strict=True)]
    # timed rounds start at i = 2 (even): ours ran first in ratios[0::2], torch in ratios[1::2]
    return {
        "ours": statistics.median(ours_t),
        "torch": statistics.median(torch_t),
        "paired": statistics.median(ratios),
        "paired_ours_first": statistics.median(ratios[0::2]),
        "paired_torch_first": statistics.median(ratios[1::2]) if len(ratios) > 1 else None,
        "peak": runner.activations.peak,
    }


def _our_runner(a: argparse.Namespace, sched: str, m: int, rank: int, p: int) -> PipelineRunner:
    """Our PipelineRunner for this rank's stage; every stage's meta copy gives it the shapes."""
    import copy

    from torch.nn import functional as F

    from disttrain.parallel import placement
    from disttrain.parallel.pipeline.runner import PipelineRunner

    ours_parts = placement.split(
        _model(p, a.layers_per_stage, a.width), [2 * a.layers_per_stage] * p
    )
    meta = [copy.deepcopy(s).to("meta") for s in ours_parts]
    return PipelineRunner(
        ours_parts[rank],
        rank,
        schedule.build(sched, m, p),
        meta,
        F.mse_loss,
        recv_ahead=_recv_ahead(a, sched),
    )


def _torch_schedule(
    a: argparse.Namespace, sched: str, m: int, rank: int, p: int
) -> PipelineScheduleSingle:
    """The anchor: torch's GPipe or 1F1B schedule on a fresh copy of the same stage."""
    from torch.distributed.pipelining import PipelineStage
    from torch.nn import functional as F

    from disttrain.parallel import placement
    from disttrain.parallel.pipeline.schedule import torch_schedule_class

    parts = placement.split(_model(p, a.layers_per_stage, a.width), [2 * a.layers_per_stage] * p)
    stage = PipelineStage(parts[rank], rank, p, torch.device("cpu"))
    cls = torch_schedule_class(sched)
    sched_obj: PipelineScheduleSingle = cls(stage, m, loss_fn=F.mse_loss)
    return sched_obj


def _alternate_rounds(
    repeats: int, ours: Callable[[], object], theirs: Callable[[], object]
) -> tuple[list[float], list[float]]:
    """Time one step of each per round, ours first in even rounds, after two warm-up rounds.

    Each step is timed between barriers, so every rank's time is the slowest
    rank's step.
    """
    import torch.distributed as dist

    def timed(step: Callable[[], object]) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        step()
        dist.barrier()
        return time.perf_counter() - t0

    ours_t, torch_t = [], []
    for i in range(repeats + 2):
        if i % 2 == 0:
            o, t = timed(ours), timed(theirs)
        else:
            t, o = timed(theirs), timed(ours)
        if i >= 2:
            ours_t.append(o)
            torch_t.append(t)
    return ours_t, torch_t


def _plot(
    path: str, ms: list[int], p: int, measured: list[float], instant: list[float] | None = None
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    grid = [m / 4 for m in range(4, 4 * max(ms) + 1)]
    ax.plot(grid, [(p - 1) / (m + p - 1) for m in grid], label="(P-1)/(M+P-1)")
    ax.plot(ms, measured, "o", label="measured (GPipe)")
    if instant is not None:
        ax.plot(ms, instant, "x", label="same actions, instant hand-offs")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("micro-batches M")
    ax.set_ylabel("bubble (idle share of stage time)")
    ax.set_title(f"GPipe bubble, P={p} stages")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(a: argparse.Namespace) -> int:
    ms = _parse_microbatches(a)
    p = a.stages
    if p < 1 or any(m < 1 for m in ms):
        raise UsageError("--stages and every --microbatches value must be >= 1")
    if a.show_schedule:
        _show_schedules(a, ms, p)
        return 0
    if not 1 <= p <= 4:
        raise UsageError(f"--stages {p}: this benchmark starts P local processes, use 1 to 4")
    if any(a.batch % m for m in ms):
        raise UsageError(f"--batch {a.batch} must be divisible by every --microbatches value")
    results: dict[str, Any] = {"stages": p, "width": a.width, "batch": a.batch, "bubble": []}
    _measure_bubbles(a, ms, p, results)
    m = max(ms)
    if a.bubble_only:
        return _write(a, results, ms, p)
    _compare_with_torch(a, m, p, results)
    if p > 1:
        _compare_tensor_slicing(a, p, results)
    return _write(a, results, ms, p)


def _parse_microbatches(a: argparse.Namespace) -> list[int]:
    """``--microbatches 1,2,4`` as numbers; anything else is a usage error."""
    try:
        return [int(v) for v in a.microbatches.split(",")]
    except ValueError:
        raise UsageError(f"--microbatches {a.microbatches!r}: use numbers like 1,2,4") from None


def _show_schedules(a: argparse.Namespace, ms: list[int], p: int) -> None:
    """Print each schedule's grid with its bubble (measured on the grid and in theory).

    Also prints the activations each rank holds at its peak, in stages' worth.
    """
    for name in a.schedule.split(","):
        kind = schedule.SCHEDULES.get(name)
        v = a.virtual_stages if kind.virtual else 1
        for m in ms:
            try:
                grid = schedule.build(name, m, p, v)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            held = [f"{kind.held(m, p, v, r):g}" for r in range(p)]
            print(
                f"{name}  M={m} P={p}"
                + (f" V={v}" if kind.virtual else "")
                + f"  bubble {schedule.bubble_fraction(grid):.3f} "
                f"(theory {kind.bubble(m, p, v):.3f})  activations held per rank "
                f"{', '.join(held)} stages' worth"
            )
            print(schedule.render(grid), end="\n\n")


def _measure_bubbles(a: argparse.Namespace, ms: list[int], p: int, results: dict[str, Any]) -> None:
    """GPipe's measured bubble at each M against (P-1)/(M+P-1), one row per M into results."""
    print(
        f"GPipe bubble, P={p}, {a.layers_per_stage} x Linear({a.width}) per stage, "
        f"batch {a.batch} (median of {a.repeats} steps; shared, noisy machine)"
    )
    print(
        f"{'M':>4} {'theory':>8} {'measured':>9} {'rel.err':>8} {'own step':>9} "
        f"{'preempted':>10} {'instant':>8} {'step s':>8}"
    )
    for m in ms:
        per_rank = _spawn(_ours, p, (a, "gpipe", m))
        theory = (p - 1) / (m + p - 1)
        row = {
            "m": m,
            "theory": theory,
            **bubble([r["steps"] for r in per_rank]),
            "step": per_rank[0]["step"],
        }
        results["bubble"].append(row)
        err = (row["measured"] - theory) / theory if theory else 0.0
        print(
            f"{m:>4} {theory:>8.3f} {row['measured']:>9.3f} {err:>+8.1%} "
            f"{row['own_step']:>9.3f} {row['preempted']:>10.3f} "
            f"{row['instant_hand_offs']:>8.3f} {row['step']:>8.4f}"
        )


def _compare_with_torch(a: argparse.Namespace, m: int, p: int, results: dict[str, Any]) -> None:
    """Step time of our GPipe and 1F1B at M against torch.distributed.pipelining's.

    With ``--skip-torch`` only ours runs; the ratio is ours over torch's.
    """
    print(f"\nStep time at M={m}: ours vs torch.distributed.pipelining (ratio < 1: ours faster)")
    results["schedules"] = {}
    for sched in ("gpipe", "1f1b"):
        row = _schedule_row(a, sched, m, p)
        results["schedules"][sched] = row
        anchor = (
            f"torch {row['torch']:.4f} s  ratio {row['ratio']:.2f}  "
            f"paired {row['paired']:.2f} (ours first {row['paired_ours_first']:.2f}, "
            f"torch first {row['paired_torch_first'] or 0:.2f})"
            if "torch" in row
            else ""
        )
        print(
            f"  {sched:<6} ours {row['ours']:.4f} s  {anchor}  "
            f"peak activations per stage {row['peak_activation_bytes']}"
        )


def _schedule_row(a: argparse.Namespace, sched: str, m: int, p: int) -> dict[str, Any]:
    """One schedule's figures: ours alone (``--skip-torch``) or ours paired with torch's."""
    if a.skip_torch:
        ours = _spawn(_ours, p, (a, sched, m))
        return {"ours": ours[0]["step"], "peak_activation_bytes": [r["peak"] for r in ours]}
    both = _spawn(_torch_pipe, p, (a, sched, m))
    return {
        "ours": both[0]["ours"],
        "torch": both[0]["torch"],
        "ratio": both[0]["ours"] / both[0]["torch"],
        "paired": both[0]["paired"],
        "paired_ours_first": both[0]["paired_ours_first"],
        "paired_torch_first": both[0]["paired_torch_first"],
        "peak_activation_bytes": [r["peak"] for r in both],
    }


def _compare_tensor_slicing(a: argparse.Namespace, p: int, results: dict[str, Any]) -> None:
    """Tensor slicing of a two-layer MLP on P ranks, against DTensor unless ``--skip-torch``."""
    print(f"\nTensor slicing, Linear({a.width},{4 * a.width})-ReLU-Linear on {p} ranks")
    print("  (all in the same processes, order rotating each round; paired = median over")
    print("   rounds of this step / DTensor's step in the same round)")
    results["tensor"] = _spawn(bench_tensor.paired_steps, p, (a, not a.skip_torch))[0]
    for how, r in results["tensor"].items():
        anchor = f"  ratio {r['ratio']:.2f}  paired {r['paired']:.2f}" if "paired" in r else ""
        print(
            f"  {how:<9} {r['step']:.4f} s  metered {r['bytes_per_step'] / 1e6:.2f} MB/step{anchor}"
        )


def _write(a: argparse.Namespace, results: dict[str, Any], ms: list[int], p: int) -> int:
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "results.json"), "w") as fh:
            json.dump(results, fh, indent=2)
        bub = results["bubble"]
        _plot(
            os.path.join(a.out, "bubble.png"),
            ms,
            p,
            [b["measured"] for b in bub],
            [b["instant_hand_offs"] for b in bub],
        )
        print(f"\nwrote {a.out}/results.json and {a.out}/bubble.png")
    return 0
