"""Emulated cluster: data-parallel samples/s of a workload across shaped link rates.

    sudo disttrain bench cluster-bandwidth --hosts 4 \\
        --bandwidths 100mbit,1gbit,10gbit --repeats 3 --max-steps 10

For each repeat, runs the anchor (the same job on ONE host: H local workers
over loopback, no shaping), then for each rate: ``cluster up``, a link probe
(TCP goodput h0 -> h1), ``cluster run -- disttrain train`` with one worker per
host, ``cluster down``. Prints medians and the ratio to the anchor's median.
Needs root (network namespaces). The machine is shared: figures are noisy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

__all__ = ["add_arguments", "run"]

NAME = "bench"


def _train_args(args: argparse.Namespace) -> list[str]:
    return [
        "--strategy",
        args.strategy,
        "--model",
        "mlp",
        "--dataset",
        "digits",
        "--max-steps",
        str(args.max_steps),
        "--epochs",
        "1",
    ]


def _samples_per_s(argv: list[str], out: str, timeout: float, launcher: list[str]) -> float:
    from disttrain.launch.commands import train_argv

    return float(train_argv(argv, out, timeout, launcher)["samples_per_second"])


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--bandwidths", default="100mbit,1gbit,10gbit")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=10)
    p.add_argument("--strategy", default="allreduce")


def run(args: argparse.Namespace) -> int:
    from disttrain.cluster import hosts as cluster
    from disttrain.cluster import linkprobe

    rates = args.bandwidths.split(",")
    dt = [sys.executable, "-m", "disttrain"]
    tmp = tempfile.mkdtemp(prefix="dt-bench-")
    anchor: list[float] = []
    shaped: dict[str, list[float]] = {r: [] for r in rates}
    goodput: dict[str, list[float]] = {r: [] for r in rates}
    for rep in range(args.repeats):
        out = os.path.join(tmp, f"anchor-{rep}")
        local = [*_train_args(args), "--workers", str(args.hosts)]
        anchor.append(_samples_per_s(local, out, 600, []))
        print(f"repeat {rep}: anchor (1 host x {args.hosts} workers) {anchor[-1]:.1f} samples/s")
        for rate in rates:
            c = cluster.plan(NAME, args.hosts, rate)
            cluster.down(NAME)
            cluster.up(c)
            try:
                link = linkprobe.measure(c.hosts[0], c.hosts[1], c.rate_bits, seconds=1.0)
                goodput[rate].append(link.bits_per_s)
                out = os.path.join(tmp, f"{rate}-{rep}")
                run = [*dt, "cluster", "run", "--name", NAME, "--timeout", "900", "--"]
                argv = [*_train_args(args), "--workers", "1"]
                shaped[rate].append(_samples_per_s(argv, out, 1000, run))
            finally:
                cluster.down(NAME)
            print(
                f"repeat {rep}: {rate}: link {link.bits_per_s / 1e6:.0f} Mbit/s, "
                f"{shaped[rate][-1]:.1f} samples/s",
                flush=True,
            )
    base = statistics.median(anchor)
    print(
        f"\n| setting | link goodput (Mbit/s, median) | samples/s (median of {args.repeats}) "
        f"| ratio to anchor |"
    )
    print("| --- | --- | --- | --- |")
    print(f"| anchor: 1 host x {args.hosts} workers, loopback | - | {base:.1f} | 1.00 |")
    for rate in rates:
        med = statistics.median(shaped[rate])
        mbit = statistics.median(goodput[rate]) / 1e6
        print(
            f"| {args.hosts} hosts x 1 worker, {rate} | {mbit:.0f} | {med:.1f} | {med / base:.2f} |"
        )
    print(
        f"\nall samples/s: anchor {[round(x, 1) for x in anchor]}, "
        + ", ".join(f"{r} {[round(x, 1) for x in v]}" for r, v in shaped.items())
    )
    return 0
