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
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

__all__ = ["VARIANTS", "add_arguments", "run"]

VARIANTS = ("none", "blocking", "async")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=10, help="steps between checkpoints")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--workers", type=int, default=2)


def _flags(variant: str, a: argparse.Namespace) -> dict[str, Any]:
    flags: dict[str, Any] = {"workers": a.workers, "model": a.model, "dataset": "digits",
                             "max_steps": a.steps, "epochs": 100}  # fmt: skip
    if variant != "none":
        flags["checkpoint_every"] = a.every
    if variant == "async":
        flags["async_checkpoint"] = True
    return flags


def run(args: argparse.Namespace) -> int:
    from disttrain.lab.runs import train_run

    rate: dict[str, list[float]] = {v: [] for v in VARIANTS}
    held: dict[str, list[float]] = {v: [] for v in VARIANTS}
    loads: list[float] = []
    for r in range(args.repeats):
        order = VARIANTS[r % 3 :] + VARIANTS[: r % 3]
        for variant in order:
            summary = train_run(_flags(variant, args))
            rate[variant].append(summary["samples_per_second"] / summary["global_batch_size"])
            seconds = float(summary["time_breakdown"].get("checkpoint", 0.0))
            held[variant].append(seconds / max(1, args.steps // args.every))
            loads.append(os.getloadavg()[0])
            print(f"round {r} {variant}: {rate[variant][-1]:.2f} steps/s", flush=True)
    print(f"{args.workers} workers, --model {args.model}, {args.steps} steps, a checkpoint every "
          f"{args.every}; load average (1 min) during the runs: median "
          f"{statistics.median(loads):.1f} on {os.cpu_count()} CPUs")  # fmt: skip
    none = rate["none"]
    for variant in VARIANTS:
        line = f"{variant:9s} {statistics.median(rate[variant]):6.2f} steps/s"
        if variant != "none":
            pairs = [1 - v / n for v, n in zip(rate[variant], none, strict=True)]
            line += (f"  overhead vs none {100 * statistics.median(pairs):+.1f} % (paired median)"
                     f"  {1000 * statistics.median(held[variant]):.0f} ms on the training path"
                     " per checkpoint")  # fmt: skip
        print(line)
    return 0
