"""Parameter-server benchmarks: sync vs async with a straggler, staleness vs N, servers.

    disttrain bench ps straggler --repeats 3
    disttrain bench ps staleness
    disttrain bench ps servers --repeats 3

Each figure is the median over ``--repeats`` runs of ``disttrain train``,
each started as a user would (the CLI in a subprocess); throughput is the
servers' own measure (samples applied / seconds from the first gradient to
the last), the same in every mode. Ratios are against the anchor measured in
the same invocation (sync PS for the straggler table, 1 server for the
servers table).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
from typing import Any

from disttrain.launch.commands import train_argv

__all__ = ["add_arguments", "run"]


def train(flags: list[str], timeout: float = 900) -> dict[str, Any]:
    """One ``disttrain train`` run; its summary.json."""
    with tempfile.TemporaryDirectory(prefix="ps-bench-") as out:
        return train_argv(flags, out, timeout)


def median_runs(flags: list[str], repeats: int) -> tuple[list[dict[str, Any]], dict[str, float]]:
    runs = [train(flags) for _ in range(repeats)]
    keys = (
        "samples_per_second",
        "final_accuracy",
        "staleness_mean",
        "staleness_max",
        "clock_gap_max",
        "wall_seconds",
    )
    med = {k: statistics.median(float(r[k]) for r in runs) for k in keys}
    return runs, med


def straggler(args: argparse.Namespace) -> None:
    common = [
        "--strategy",
        "ps",
        "--workers",
        "4",
        "--servers",
        "1",
        "--model",
        args.model,
        "--epochs",
        str(args.epochs),
        "--straggler",
        "3:4",
        *shlex.split(args.extra),
    ]
    cases = {
        "sync": ["--ps-mode", "sync"],
        "async": ["--ps-mode", "async"],
        "async --staleness-lr": ["--ps-mode", "async", "--staleness-lr"],
    }
    print(
        f"digits, {args.model}, 4 workers + 1 server, --straggler 3:4, {args.epochs} epochs, "
        f"median of {args.repeats}"
    )
    print(
        "| mode | samples/s | vs sync | test accuracy | staleness mean / max | runs (samples/s) |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    anchor = None
    for name, extra in cases.items():
        runs, med = median_runs(common + extra, args.repeats)
        anchor = anchor or med["samples_per_second"]
        each = ", ".join(f"{r['samples_per_second']:.0f}" for r in runs)
        print(
            f"| {name} | {med['samples_per_second']:.0f} | "
            f"{med['samples_per_second'] / anchor:.2f}x | {med['final_accuracy']:.4f} | "
            f"{med['staleness_mean']:.2f} / {med['staleness_max']:.0f} | {each} |"
        )
        print(f"  command: disttrain train {shlex.join(common + extra)}", file=sys.stderr)


def staleness(args: argparse.Namespace) -> None:
    print(
        f"plain async, equal workers, 1 server, {args.model}, {args.max_steps} steps, "
        f"median of {args.repeats}"
    )
    print("| workers N | staleness mean | N-1 | staleness max | histogram (first run) |")
    print("| --- | --- | --- | --- | --- |")
    for n in (2, 4, 6):
        flags = [
            "--strategy",
            "ps",
            "--ps-mode",
            "async",
            "--workers",
            str(n),
            "--batch-size",
            str(16 * n),
            "--model",
            args.model,
            "--max-steps",
            str(args.max_steps),
        ]
        runs, med = median_runs(flags, args.repeats)
        print(
            f"| {n} | {med['staleness_mean']:.2f} | {n - 1} | {med['staleness_max']:.0f} | "
            f"{runs[0]['staleness_histogram']} |"
        )
        print(f"  command: disttrain train {shlex.join(flags)}", file=sys.stderr)


def servers(args: argparse.Namespace) -> None:
    print(
        f"sync PS, 2 workers, mlp (6.4M parameters), {args.max_steps} steps, "
        f"median of {args.repeats}"
    )
    print("| servers K | samples/s | ratio vs K=1 | MB in per server | MB out per server |")
    print("| --- | --- | --- | --- | --- |")
    anchor = None
    for k in (1, 2, 4):
        flags = [
            "--strategy",
            "ps",
            "--ps-mode",
            "sync",
            "--workers",
            "2",
            "--servers",
            str(k),
            "--model",
            "mlp",
            "--max-steps",
            str(args.max_steps),
        ]
        runs, med = median_runs(flags, args.repeats)
        anchor = anchor or med["samples_per_second"]
        per = runs[0]["per_server"]
        mb_in = "/".join(f"{s['bytes_in'] / 1e6:.0f}" for s in per)
        mb_out = "/".join(f"{s['bytes_out'] / 1e6:.0f}" for s in per)
        print(
            f"| {k} | {med['samples_per_second']:.0f} | "
            f"{med['samples_per_second'] / anchor:.2f}x | {mb_in} | {mb_out} |"
        )
        print(f"  command: disttrain train {shlex.join(flags)}", file=sys.stderr)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("which", choices=("straggler", "staleness", "servers"))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--extra", default="", help="more train flags, e.g. '--optimizer sgd'")


def run(args: argparse.Namespace) -> int:
    {"straggler": straggler, "staleness": staleness, "servers": servers}[args.which](args)
    return 0
