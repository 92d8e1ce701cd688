"""What --timeline costs: steps/s with and without it, runs alternating, and ns per span.

    disttrain bench timeline-overhead [--repeats 3] [--steps 60]

Runs ``disttrain train`` (2 workers, mlp/digits, allreduce) alternately without
and with ``--timeline`` so that load on the machine hits both alike, and prints
the median steps/s of each and their ratio. Then times one ``timeline.span``
enter/exit in this process, off and on, and counts the events of a step in the
trace, for the cost per step that the ratio cannot resolve on a noisy machine
(CPU time of the calling thread, so that other processes' load is left out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from disttrain import timeline

__all__ = ["add_arguments", "run"]

BASE = {"workers": 2, "model": "mlp", "dataset": "digits", "epochs": 10}


def _span_ns(calls: int = 200_000) -> float:
    """CPU time of one span (thread time: the time other processes take is left out)."""
    start = time.thread_time_ns()
    for _ in range(calls):
        with timeline.span("x", "compute", step=1):
            pass
    return (time.thread_time_ns() - start) / calls


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)


def run(args: argparse.Namespace) -> int:
    from disttrain.launch.commands import train_run

    flags = {**BASE, "max_steps": args.steps}
    runs: dict[str, list[float]] = {"off": [], "on": []}
    events_per_step = 0.0
    for _ in range(args.repeats):
        for variant in ("off", "on"):
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "t.json")
                extra = {"timeline": path} if variant == "on" else {}
                summary = train_run({**flags, **extra})
                # samples/s over training time (eval left out) -> steps/s
                runs[variant].append(summary["samples_per_second"] / summary["global_batch_size"])
                print(f"{variant}: {runs[variant][-1]:.2f} steps/s", flush=True)
                if variant == "on":
                    with open(path) as fh:
                        events = [e for e in json.load(fh)["traceEvents"] if e["ph"] == "X"]
                    events_per_step = len(events) / summary["steps"] / summary["workers"]
    off, on = statistics.median(runs["off"]), statistics.median(runs["on"])
    print(f"load average: {os.getloadavg()[0]:.1f} (1 min) on {os.cpu_count()} CPUs")
    print(f"steps/s without --timeline: {off:.2f}  (runs: {[round(r, 2) for r in runs['off']]})")
    print(f"steps/s with    --timeline: {on:.2f}  (runs: {[round(r, 2) for r in runs['on']]})")
    print(f"ratio with/without: {on / off:.3f}")
    timeline.stop()
    null_ns = _span_ns()
    timeline.start(0)
    on_ns = _span_ns()
    timeline.stop()
    per_step_us = events_per_step * on_ns / 1000
    print(f"one span: {null_ns:.0f} ns off, {on_ns:.0f} ns on")
    print(
        f"{events_per_step:.1f} events per step per rank -> ~{per_step_us:.1f} us per step on, "
        f"{per_step_us * 1e-6 * off:.5f} of a step at {off:.2f} steps/s"
    )
    return 0
