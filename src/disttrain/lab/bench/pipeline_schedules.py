"""Interleaved and zero-bubble schedules: replayed bubble vs theory, step time vs torch's.

    disttrain bench pipeline-schedules --stages 2 --microbatches 4,8 --repeats 5

Part 1, the bubble: each schedule (``--schedules``) runs on P local processes
(gloo, one thread each); every rank records each action's measured seconds,
by default its CPU time (``time.thread_time``: on a loaded machine an action's
wall time also holds the spans in which the OS ran another process).
:func:`schedule.replay` lays durations out with instant hand-offs, four ways
(:func:`_bubble_rows`): ``theory`` every action one tick (equal stages, F = B =
W); ``@means`` every action of a kind at the kind's mean measured duration
(equal stages at this machine's F:B:W: zb1's bubble is (P-1)(F+B-W), not the
F = B = W figure); ``@stages`` each rank's own mean per kind: the schedule's
bubble on the stages as measured (the last computes the loss, the first no
input gradient), the theory to compare with; ``replay`` each action's median
over the timed steps. ``rel.err`` = replay / @stages - 1 is the spread of the
actions within a rank and kind (the machine's noise in compute, e.g. a step's
first forward running on cold caches). ``wall``: the measured wall-clock
bubble (one host clock for every rank: 1 - compute / the pipeline's window);
``machine`` = wall minus the replay of the same steps' wall durations: what
hand-offs and waits for a core add (on shared cores, most of the wall bubble).

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
        "--pairs",
        default="interleaved/torch,zb1/torch,zb1/1f1b,zb2/1f1b",
        help="paired step times OURS/ANCHOR (ANCHOR: one of ours, or torch), comma-separated; "
        "'none' for none",
    )
    parser.add_argument(
        "--wall",
        dest="cpu",
        action="store_false",
        help="replay each action's wall time (default: its CPU time, free of preemptions)",
    )


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
    return PipelineRunner(
        parts[rank::p], rank, grid, meta, F.mse_loss, recv_ahead=recv_ahead_default(name)
    )


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
        steps, times, wall = [], [], []
        for i in range(a.repeats + 2):
            t = _timed(lambda: runner.run(x, y))  # noqa: B023 (called at once)
            if i >= 2:
                rt = runner.times
                steps.append(list(rt.actions_cpu if a.cpu else rt.actions))
                times.append(t)
                # one clock for the host's processes: the ranks' steps lie on one time line
                wall.append((rt.start, rt.end, rt.compute, list(rt.actions)))
        out[name] = {
            "actions": steps,
            "step": statistics.median(times),
            "wall": wall,
            "peak": runner.activations.peak,
            "peak_total": runner.activations.peak_total,
        }
    return out


Orders = list[list[tuple[str, int, float]]]


def _idle(orders: Orders, virtual: int) -> float:
    """The mean idle share of the ranks when ``orders`` are replayed with instant hand-offs."""
    window, busy = schedule.replay(orders, virtual=virtual)
    return statistics.mean(1 - b / window for b in busy)


def _bubble_rows(
    per_rank: list[dict[str, Any]], names: list[str], m: int, p: int, v: int
) -> list[dict[str, Any]]:
    """The bubble of each schedule, from its theory to the measured actions, in four steps:

    ``theory``: every action one tick (F = B = W). ``at_means``: every action of a kind
    given the kind's mean measured duration: the schedule's own bubble at this machine's
    F:B:W (the theory to compare with; zb1's and zb2's depend on the ratio). ``stages``:
    each rank's mean duration of each kind: adds the stages' unequal compute (the last
    computes the loss, the first no input gradient). ``replay``: each action's own median
    over the timed steps: adds the actions' spread within a rank and kind (the machine's
    noise). ``per step``: each step replayed alone, median over steps (its jitter too).
    """
    rows = []
    for name in names:
        kind = SCHEDULES.get(name)
        vv = v if kind.virtual else 1
        steps = [r[name]["actions"] for r in per_rank]
        per_step = [_idle([list(s) for s in step], vv) for step in zip(*steps, strict=True)]
        # each action's median over the timed steps (per rank, per position)
        medians: Orders = [
            [
                (k, mb, statistics.median(st[i][2] for st in acts))
                for i, (k, mb, _) in enumerate(acts[0])
            ]
            for acts in steps
        ]
        means = _kind_means(medians)
        at_means = [[(k, mb, means[k[0]]) for k, mb, _ in acts] for acts in medians]
        stage_means = [_kind_means([acts]) for acts in medians]
        at_stages = [
            [(k, mb, sm[k[0]]) for k, mb, _ in acts]
            for acts, sm in zip(medians, stage_means, strict=True)
        ]
        rows.append(
            {
                "schedule": name,
                "m": m,
                "theory": kind.bubble(m, p, vv),
                "at_means": _idle(at_means, vv),
                "stages": _idle(at_stages, vv),
                "replay": _idle(medians, vv),
                "per_step": statistics.median(per_step),
                "durations": means,
                "step": per_rank[0][name]["step"],
                "peak_activation_bytes": [r[name]["peak"] for r in per_rank],
                "peak_with_w_grads": [r[name].get("peak_total", r[name]["peak"]) for r in per_rank],
                **_wall(per_rank, name, vv),
            }
        )
    return rows


def _wall(per_rank: list[dict[str, Any]], name: str, virtual: int) -> dict[str, float]:
    """The measured wall-clock bubble and the replay of the same steps' wall durations.

    ``wall``: per step, the pipeline's window (the first rank's start to the last rank's
    end, one host clock) and each rank's idle share 1 - compute / window, averaged over the
    ranks; median over steps. ``wall_replay``: the same steps' actions at their wall
    durations with instant hand-offs. ``wall - wall_replay`` is what the machine adds to
    the schedule's bubble: hand-offs, and waits for a core (on shared cores, most of it).
    """
    if any("wall" not in r[name] for r in per_rank):
        return {}
    idle, replayed = [], []
    for step in zip(*(r[name]["wall"] for r in per_rank), strict=True):
        window = max(end for _, end, _, _ in step) - min(start for start, _, _, _ in step)
        idle.append(statistics.mean(1 - compute / window for _, _, compute, _ in step))
        replayed.append(_idle([list(acts) for *_, acts in step], virtual))
    return {"wall": statistics.median(idle), "wall_replay": statistics.median(replayed)}


def _kind_means(orders: Orders) -> dict[str, float]:
    """Mean seconds of each action kind (F, B, W; chunks together) over ``orders``' actions."""
    by: dict[str, list[float]] = {}
    for acts in orders:
        for k, _, sec in acts:
            by.setdefault(k[0], []).append(sec)
    return {k: statistics.mean(v) for k, v in by.items()}


def _torch_schedule(a: argparse.Namespace, which: str, m: int) -> tuple[Callable[[], None], int]:
    """A step of torch's ``which`` schedule on P·V stages, rank r holding r, r+P, ..."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.nn import functional as F

    rank, p = dist.get_rank(), dist.get_world_size()
    v = a.virtual_stages
    parts = _parts(a, p * v)
    stages = [PipelineStage(parts[s], s, p * v, torch.device("cpu")) for s in range(rank, p * v, p)]
    cls = schedule.torch_schedule_class(which)  # the torch class our schedule is measured against
    sch = cls(stages, m, loss_fn=F.mse_loss)
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
    """Paired rounds of our ``ours`` against ``theirs`` (``torch:NAME``, torch's counterpart of
    our NAME, or ``our:NAME``)."""
    x, y = torch.randn(a.batch, a.width), torch.randn(a.batch, a.width)
    runner = _runner(a, ours, m)
    try:
        if theirs.startswith("our:"):
            anchor = _runner(a, theirs[4:], m)
            other: Callable[[], object] = lambda: anchor.run(x, y)  # noqa: E731
        else:
            other, _ = _torch_schedule(a, theirs.removeprefix("torch:"), m)
            other()  # one step outside the timing: it raises here if it cannot run on gloo
    except Exception as exc:  # the anchor's own failure is the result to record
        return {"error": f"{type(exc).__name__}: {exc}"}
    o_t, t_t = [], []
    # this rank's compute per step, (wall, CPU) seconds, of ours and of our anchor: on shared
    # cores a smaller bubble lets the ranks compute at once, so they wait for cores instead
    work: dict[str, list[tuple[float, float]]] = {"ours": [], "theirs": []}
    for i in range(a.repeats + 2):
        if i % 2 == 0:
            o, t = _timed(lambda: runner.run(x, y)), _timed(other)
        else:
            t, o = _timed(other), _timed(lambda: runner.run(x, y))
        if i >= 2:
            o_t.append(o)
            t_t.append(t)
            work["ours"].append((runner.times.compute, runner.times.compute_cpu))
            if theirs.startswith("our:"):
                work["theirs"].append((anchor.times.compute, anchor.times.compute_cpu))
    return {
        "ours": statistics.median(o_t),
        "theirs": statistics.median(t_t),
        "paired": statistics.median(o / t for o, t in zip(o_t, t_t, strict=True)),
        "compute": {
            k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
            for k, v in work.items()
            if v
        },
    }


def _spawn(fn: Callable[..., Any], size: int, args: tuple[Any, ...]) -> list[Any]:
    from disttrain.launch.spawn import run_world

    return run_world(fn, size, args, timeout=600, collective_timeout=120)


def _pairs(text: str, skip_torch: bool) -> list[tuple[str, str]]:
    """``zb1/1f1b,interleaved/torch`` -> [(ours, anchor)]; an anchor is ``our:NAME`` or
    ``torch:NAME`` (the torch class our schedule's kind names as its counterpart)."""
    if text.strip() == "none":
        return []
    out = []
    for item in text.split(","):
        ours, sep, theirs = item.strip().partition("/")
        if not sep:
            raise UsageError(f"--pairs {item!r}: write OURS/ANCHOR, e.g. zb1/1f1b or zb1/torch")
        kind = SCHEDULES.get(ours)
        if theirs == "torch":
            # here: torch's multi-stage classes (rank r holds stages r, r+P, ...), the
            # counterparts of schedules with virtual stages or a split backward
            if not (kind.torch_anchor and (kind.virtual or kind.splits_backward)):
                raise UsageError(f"--pairs {item!r}: torch has no counterpart of {ours} here")
            if not skip_torch:
                out.append((ours, "torch:" + ours))
        else:
            SCHEDULES.get(theirs)
            out.append((ours, "our:" + theirs))
    return out


def run(a: argparse.Namespace) -> int:
    try:
        ms = [int(v) for v in a.microbatches.split(",")]
    except ValueError:
        raise UsageError(f"--microbatches {a.microbatches!r}: use numbers like 4,8") from None
    names = a.schedules.split(",")
    for name in names:
        SCHEDULES.get(name)  # an unknown name: one line
    pairs = _pairs(a.pairs, a.skip_torch)
    p, v = a.stages, a.virtual_stages
    if not 2 <= p <= 4:
        raise UsageError(f"--stages {p}: this benchmark starts P local processes, use 2 to 4")
    if a.layers % (p * v) or any(a.batch % m or m % p for m in ms):
        raise UsageError(
            f"--layers {a.layers} must split into {p}x{v} stages and every M must divide "
            f"--batch {a.batch} and be a multiple of --stages {p}"
        )
    _bubbles(a, names, ms, p, v)
    if not pairs:
        return 0
    _compare_pairs(a, pairs, max(ms), p)
    return 0


def _bubbles(a: argparse.Namespace, names: list[str], ms: list[int], p: int, v: int) -> None:
    """Each schedule's bubble at each M: theory, at the mean action times, at each stage's own
    times, and replayed from the measured actions (the error is replay's against stages')."""
    print(
        f"P={p}, V={v}, {a.layers} x Linear({a.width})+ReLU, batch {a.batch}, "
        f"median of {a.repeats} steps"
    )
    print(
        f"{'schedule':<12}{'M':>3} {'theory':>7} {'@means':>7} {'@stages':>8} {'replay':>7} "
        f"{'rel.err':>8} {'per step':>9} {'wall':>6} {'machine':>8}  F/B/W ms{'':<14}"
        f"{'step s':>7}  peak activations (with W's gradients)"
    )
    for m in ms:
        per_rank = _spawn(_replays, p, (a, names, m))
        for row in _bubble_rows(per_rank, names, m, p, v):
            err = (row["replay"] - row["stages"]) / row["stages"]
            dur = "/".join(
                f"{row['durations'][k] * 1e3:.2f}" for k in "FBW" if k in row["durations"]
            )
            print(
                f"{row['schedule']:<12}{m:>3} {row['theory']:>7.3f} {row['at_means']:>7.3f} "
                f"{row['stages']:>8.3f} {row['replay']:>7.3f} {err:>+8.1%} "
                f"{row['per_step']:>9.3f} {row['wall']:>6.3f} "
                f"{row['wall'] - row['wall_replay']:>+8.3f}  {dur:<22}{row['step']:>7.4f}  "
                f"{row['peak_activation_bytes']} ({row['peak_with_w_grads']})"
            )


def _compare_pairs(a: argparse.Namespace, pairs: list[tuple[str, str]], m: int, p: int) -> None:
    """Each pair's step time at M, ours against its anchor in paired rounds, with each rank's
    compute a step (wall and CPU ms); an anchor that failed is reported and skipped."""
    print(f"\nStep time at M={m}, paired rounds (ratio < 1: ours faster)")
    for ours, theirs in pairs:
        per_rank = _spawn(_paired, p, (a, ours, theirs, m))
        r = per_rank[0]
        label = theirs
        if theirs.startswith("torch:"):
            label = "torch " + SCHEDULES.get(theirs.removeprefix("torch:")).torch_anchor
        if "error" in r:
            print(f"  {ours:<12} vs {label}: anchor failed: {r['error']}")
            continue
        print(
            f"  {ours:<12} vs {label}: ours {r['ours']:.4f} s, theirs {r['theirs']:.4f} s, "
            f"paired {r['paired']:.2f}"
        )
        for side in r["compute"]:  # each rank's compute a step: wall (CPU) ms
            cells = ", ".join(
                f"{q['compute'][side][0] * 1e3:.1f} ({q['compute'][side][1] * 1e3:.1f})"
                for q in per_rank
            )
            print(f"    {side:<6} compute per rank, wall (CPU) ms: {cells}")
