"""Validate the cost model of disttrain advise: calibrate, then predict and measure, in one run.

    disttrain bench costmodel-validation --workers 4 --rates 100mbit,300mbit,1gbit \\
        --json benchmarks/results/costmodel_validation.json

(The emulated-cluster part needs root and iproute2; without them it is skipped and
said so.) Steps, all in this one process so the machine's load is comparable:

1. Calibrate (:func:`disttrain.lab.calibrate.calibrate`): bench allreduce at n = 2..W with
   ring, tree, star and all-to-all at 4KB, 1MB, 8MB; bench dp for compute rates.
2. Allreduce: bench allreduce at n = 2..W, EVERY algorithm at 4KB, 64KB, 1MB, 8MB, each
   row predicted from the n-rank shared-host link. Rows whose algorithm or size the fit
   never saw are marked held out.
3. Data parallel: bench dp at n = 2..W, global batch 96 (a per-rank batch the compute fit
   never saw), fusion 4 MB and 0 (one allreduce per tensor), no overlap: step time =
   batch / median samples/s, predicted as compute (with n ranks sharing the cores) plus
   one native allreduce per bucket of the mlp's real buckets.
4. Emulated cluster: 4 hosts x 1 worker at each rate, `disttrain train` (mlp, digits,
   batch 64, no overlap); step time = median of the per-step wall-clock differences in
   metrics.jsonl after 3 warm-up steps; predicted with β from the link's measured TCP
   goodput (measured both ways at once, as a ring uses a link) and α, γ from the calibration.

Error = |predicted - measured| / measured. Rows the calibration itself measured (same
algorithm and size) are printed apart as "fitted": only the held-out rows score the model,
per kind, with how many rows each kind over- and under-predicts (a kind all of one sign is
a bias the median hides).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import tempfile
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from disttrain.lab.calibration import Calibration

__all__ = ["add_arguments", "report", "run"]

VAL_SIZES = ("4KB", "64KB", "1MB", "8MB")
DP_BATCH = 96


def _uptime() -> str:
    """The load averages, as ``uptime`` prints them (read from the kernel, no process)."""
    one, five, fifteen = os.getloadavg()
    return f"load average: {one:.2f}, {five:.2f}, {fifteen:.2f}"


def _row(kind: str, config: str, measured: float, predicted: float, held_out: bool) -> dict:
    return {
        "kind": kind,
        "config": config,
        "measured_s": measured,
        "predicted_s": predicted,
        "error": abs(predicted - measured) / measured,
        "held_out": held_out,
    }


def _allreduce(cal: Calibration, workers: int) -> list[dict[str, Any]]:
    from disttrain import collectives
    from disttrain.lab import calibrate, costmodel
    from disttrain.lab.bench.allreduce import parse_size

    # what the calibration measured: its algorithms at CAL_SIZES, the shared-memory ones
    # at SHARED_MEMORY_SIZES
    cal_sizes = {parse_size(s) for s in calibrate.CAL_SIZES}
    fitted_sizes = {a: cal_sizes for a, c in collectives.ALGORITHMS.items() if c.calibrates}
    shm_sizes = {parse_size(s) for s in calibrate.SHARED_MEMORY_SIZES}
    fitted_sizes.update(dict.fromkeys(calibrate.shared_memory_algorithms(), shm_sizes))
    out = []
    for n in range(2, workers + 1):
        print(f"validate: bench allreduce on {n} ranks, all algorithms", flush=True)
        rows = calibrate.bench_allreduce_rows(n, VAL_SIZES, list(collectives.ALGORITHMS))
        net = calibrate.loopback_network(cal, n)
        for r in rows:
            pred, _ = costmodel.allreduce_seconds(r["algorithm"], r["size"], n, net, cal)
            seen = r["size"] in fitted_sizes.get(r["algorithm"], ())
            out.append(
                _row(
                    "allreduce",
                    f"n={n} {r['algorithm']} {r['size'] >> 10}KB",
                    r[calibrate.STAT],
                    pred,
                    not seen,
                )
            )
    return out


def _dp(cal: Calibration, workers: int, params: int) -> list[dict[str, Any]]:
    from disttrain.lab import calibrate, costmodel

    out = []
    for n in range(2, workers + 1):
        print(f"validate: bench dp on {n} ranks, batch {DP_BATCH}", flush=True)
        rows = calibrate.bench_dp_rows(n, DP_BATCH)
        for fusion in (4.0, 0.0):
            measured = DP_BATCH / rows[f"dp fusion={fusion:g} no-overlap"]["samples_per_second"]
            work = costmodel.Workload(
                params=params,
                batch_size=DP_BATCH,
                ranks_per_host=n,
                buckets=calibrate.mlp_buckets(fusion),
            )
            net = calibrate.loopback_network(cal, n)
            p = costmodel.predict("allreduce:native", work, n, net, cal)
            out.append(
                _row(
                    "dp",
                    f"n={n} mlp batch {DP_BATCH} fusion {fusion:g}MB",
                    measured,
                    p.step_seconds,
                    True,
                )
            )
    return out


def _step_seconds(out: str) -> float:
    with open(os.path.join(out, "metrics.jsonl")) as fh:
        walls = [json.loads(line) for line in fh]
    walls = [m["wall_seconds"] for m in walls if "step" in m and "wall_seconds" in m]
    return statistics.median(b - a for a, b in itertools.pairwise(walls[3:]))


def _train_on_cluster(name: str, folder: str, steps: int) -> float:
    """Train mlp on digits for ``steps`` steps on the emulated cluster ``name`` (one worker a
    host, no overlap); return the median step seconds (:func:`_step_seconds`)."""
    from disttrain.cluster.command import run_args
    from disttrain.launch import commands

    flags = [
        "--model",
        "mlp",
        "--dataset",
        "digits",
        "--batch-size",
        "64",
        "--max-steps",
        str(steps),
        "--epochs",
        "1",
        "--no-overlap",
        "--workers",
        "1",
    ]
    commands.train_argv(flags, folder, 1000, commands.argv(run_args(name, 900)))
    return _step_seconds(folder)


def _cluster(cal: Calibration, rates: list[str], params: int, steps: int) -> list[dict[str, Any]]:
    from disttrain.cluster import hosts as cluster
    from disttrain.cluster import linkprobe, netns
    from disttrain.comm.errors import UsageError
    from disttrain.lab import calibrate, costmodel

    try:
        netns.check_tools()
    except UsageError as exc:
        print(f"validate: emulated cluster skipped: {exc}")
        return []
    out, hosts, name = [], 4, "cmv"
    tmp = tempfile.mkdtemp(prefix="dt-cmv-")
    for rate in rates:
        print(f"validate: emulated cluster, {hosts} hosts at {rate}", flush=True)
        c = cluster.plan(name, hosts, rate)
        cluster.down(name)
        cluster.up(c)
        try:
            # a ring's hosts send and receive at once: goodput measured both ways at once
            link = linkprobe.measure_duplex(c.hosts[0], c.hosts[1], c.rate_bits, seconds=1.0)
            measured = _train_on_cluster(name, os.path.join(tmp, rate), steps)
        finally:
            cluster.down(name)
        net = costmodel.Network(alpha=cal.alpha, beta=8 / link.bits_per_s, name=rate)
        work = costmodel.Workload(
            params=params, batch_size=64, ranks_per_host=hosts, buckets=calibrate.mlp_buckets(4.0)
        )
        p = costmodel.predict("allreduce:native", work, hosts, net, cal)
        out.append(
            _row(
                "cluster",
                f"{hosts} hosts {rate} (goodput {link.bits_per_s / 1e6:.0f} Mbit/s) mlp batch 64",
                measured,
                p.step_seconds,
                True,
            )
        )
    return out


def _med(rows: list[dict[str, Any]]) -> str:
    return f"{statistics.median(r['error'] for r in rows):.1%} ({len(rows)} rows)" if rows else "-"


def _signs(rows: list[dict[str, Any]]) -> str:
    """How many rows the model over- and under-predicts: a group all of one sign is a bias."""
    over = sum(r["predicted_s"] > r["measured_s"] for r in rows)
    return f"{over} over, {len(rows) - over} under"


def _table(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{title}\n\n| kind | configuration | measured ms | predicted ms | error |")
    print("| --- | --- | ---: | ---: | ---: |")
    for r in rows:
        signed = (r["predicted_s"] - r["measured_s"]) / r["measured_s"]
        print(
            f"| {r['kind']} | {r['config']} | {r['measured_s'] * 1e3:.3g} | "
            f"{r['predicted_s'] * 1e3:.3g} | {signed:+.0%} |"
        )


def report(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Print fitted and held-out rows apart; the held-out medians are the model's score.

    Returns the summary lines by group (``held out``, ``held out KIND``, ``fitted``).
    """
    held = [r for r in rows if r["held_out"]]
    fitted = [r for r in rows if not r["held_out"]]
    _table("Fitted: configurations the calibration measured (re-measured, not a test)", fitted)
    _table("Held out: algorithm, size, batch or network the fit never saw", held)
    out = {"fitted": f"{_med(fitted)}; {_signs(fitted)}", "held out": _med(held)}
    for kind in sorted({r["kind"] for r in held}):
        group = [r for r in held if r["kind"] == kind]
        out[f"held out {kind}"] = f"{_med(group)}; {_signs(group)}"
    for algo in sorted({r["config"].split()[1] for r in held if r["kind"] == "allreduce"}):
        group = [r for r in held if r["kind"] == "allreduce" and r["config"].split()[1] == algo]
        out[f"held out allreduce {algo}"] = f"{_med(group)}; {_signs(group)}"
    print("\nmedian absolute error")
    for name, line in out.items():
        print(f"  {name}: {line}")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rates", default="100mbit,300mbit,1gbit", help="'' to skip the cluster")
    p.add_argument("--cluster-steps", type=int, default=12)
    p.add_argument("--json", default="")
    p.add_argument("--calibration-out", default="", help="also save the calibration here")


def run(args: argparse.Namespace) -> int:
    from disttrain.lab import calibrate

    up_before = _uptime()
    print(f"uptime before: {up_before}", flush=True)
    cal = calibrate.calibrate(args.workers)  # the algorithms that declare `calibrates`
    if args.calibration_out:
        cal.save(args.calibration_out)
    print(calibrate.describe(cal), flush=True)
    params, _ = calibrate.mlp_params()
    rows = _allreduce(cal, args.workers)
    rows += _dp(cal, args.workers, params)
    rates = [r for r in args.rates.split(",") if r]
    rows += _cluster(cal, rates, params, args.cluster_steps)
    up_after = _uptime()
    summary = report(rows)
    print(f"uptime before: {up_before}\nuptime after:  {up_after}")
    if args.json:
        result = {
            "uptime_before": up_before,
            "uptime_after": up_after,
            "calibration": cal.__dict__,
            "rows": rows,
            "summary": summary,
        }
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1, default=str)
    return 0
