"""What checkpoints cost a step: none vs blocking vs --async-checkpoint, runs alternating.

    disttrain bench checkpoint-overhead [--repeats 3] [--steps 200] [--every 10] [--model mlp]
                                        [--workers 2]

Runs ``disttrain train`` (``--workers`` workers, allreduce, the default model on digits:
6.4M parameters, 51 MB of weights and momentum per worker) with no checkpoints, with a
blocking checkpoint every ``--every`` steps and with the same checkpoints written in the
background (``--async-checkpoint``: the writer thread), in a rotating order each
round so that load on the machine hits all three alike. Per variant: the median
steps/s (training time, eval left out), the paired overhead (the median over rounds
of 1 - variant / none in the same round) and the seconds the training path spent in
checkpoints per checkpoint (``time_breakdown["checkpoint"]``: the blocking write, or
the async copy plus the final wait for the last write).

Steady state apart: the first checkpoints of a run pay for memory the process and the
page cache touch for the first time (on a VM that returns free memory to its host, a
first touch faults in the host too: such a write into the page cache takes several
times the CPU of a later one), once per run.
The "steady" figures time whole periods of ``--every`` steps from checkpoint
``--settle`` to the last one before the end, from ``metrics.jsonl`` (evaluations
left out), so they hold what every later checkpoint costs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from typing import Any

__all__ = ["VARIANTS", "add_arguments", "run"]

VARIANTS = ("none", "blocking", "async")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=10, help="steps between checkpoints")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--settle", type=int, default=5, help="checkpoints before the steady-state window"
    )


def steady_rate(metrics: str, first: int, last: int) -> float:
    """Steps/s from the end of step ``first`` to the end of step ``last`` of a run's
    metrics.jsonl, evaluations left out (an evaluation line's wall clock minus its step's)."""
    walls: dict[int, float] = {}
    evals = 0.0
    with open(metrics) as fh:
        for line in fh:
            row = json.loads(line)
            if "loss" in row:
                walls[row["step"]] = row["wall_seconds"]
            elif "test_loss" in row and first < row["step"] < last:
                evals += row["wall_seconds"] - walls[row["step"]]
    return (last - first) / (walls[last] - walls[first] - evals)


def _flags(variant: str, a: argparse.Namespace) -> dict[str, Any]:
    flags: dict[str, Any] = {
        "workers": a.workers,
        "model": a.model,
        "dataset": "digits",
        "max_steps": a.steps,
        "epochs": 100,
    }
    if variant != "none":
        flags["checkpoint_every"] = a.every
    if variant == "async":
        flags["async_checkpoint"] = True
    return flags


def run(args: argparse.Namespace) -> int:
    from disttrain.comm.errors import UsageError
    from disttrain.launch.commands import train_run

    rate: dict[str, list[float]] = {v: [] for v in VARIANTS}
    steady: dict[str, list[float]] = {v: [] for v in VARIANTS}
    held: dict[str, list[float]] = {v: [] for v in VARIANTS}
    loads: list[float] = []
    # whole periods: from checkpoint `settle` to the last one before the final step
    first, last = args.settle * args.every, (args.steps - 1) // args.every * args.every
    if last <= first:
        raise UsageError(f"--steps {args.steps} leaves no period after --settle {args.settle}")
    for r in range(args.repeats):
        order = VARIANTS[r % 3 :] + VARIANTS[: r % 3]
        for variant in order:
            with tempfile.TemporaryDirectory(prefix="disttrain-bench-") as tmp:
                summary = train_run(_flags(variant, args), out=tmp)
                metrics = os.path.join(tmp, "metrics.jsonl")
                steady[variant].append(steady_rate(metrics, first, last))
            rate[variant].append(summary["samples_per_second"] / summary["global_batch_size"])
            seconds = float(summary["time_breakdown"].get("checkpoint", 0.0))
            held[variant].append(seconds / max(1, args.steps // args.every))
            loads.append(os.getloadavg()[0])
            print(
                f"round {r} {variant}: {rate[variant][-1]:.2f} steps/s, steady "
                f"{steady[variant][-1]:.2f}",
                flush=True,
            )
    print(
        f"{args.workers} workers, --model {args.model}, {args.steps} steps, a checkpoint every "
        f"{args.every}; load average (1 min) during the runs: median "
        f"{statistics.median(loads):.1f} on {os.cpu_count()} CPUs"
    )
    for variant in VARIANTS:
        line = (
            f"{variant:9s} {statistics.median(rate[variant]):6.2f} steps/s (steady "
            f"{statistics.median(steady[variant]):.2f})"
        )
        if variant != "none":
            line += (
                f"  overhead vs none {_paired(rate, variant):+.1f} % (paired median; steady,"
                f" steps {first}-{last}: {_paired(steady, variant):+.1f} %)"
                f"  {1000 * statistics.median(held[variant]):.0f} ms on the training path"
                " per checkpoint"
            )
        print(line)
    return 0


def _paired(rates: dict[str, list[float]], variant: str) -> float:
    """The median over rounds of 1 - variant / none in the same round, in %."""
    pairs = [1 - v / n for v, n in zip(rates[variant], rates["none"], strict=True)]
    return 100 * statistics.median(pairs)
