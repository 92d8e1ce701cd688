"""Time to the synchronous run's final loss on the emulated cluster, at each link rate.

    sudo disttrain bench cluster-time-to-loss --rates 100mbit,10gbit --hosts 4 \\
        --strategies "allreduce:ring, diloco:period=50:algorithm=ring" --max-steps 300

For each rate in ``--rates``: ``cluster up`` makes ``--hosts`` hosts (network
namespaces, each link shaped to the rate by tc tbf); every spec of ``--strategies``
(compare's grammar; the first is the anchor) trains the same workload as one worker
per host through ``disttrain cluster run``, one run after another; then ``cluster
down``. The workload is talking-less's ``diloco`` one (the default gpt on 2M
characters of pycode, global batch 32, Adam 0.002 with a 0.1-epoch warm-up and cosine
decay; DiLoCo at its defaults, outer SGD lr 0.7, Nesterov 0.9) cut to ``--max-steps``
(the schedule decays over those steps), or ``--workload digits`` (mlp).

The loss is rank 0's training loss from metrics.jsonl (one line every ``--log-every``
steps, each with the seconds since training began), as a trailing mean over
``--window`` steps (one batch's loss is noisy); for DiLoCo that is the loss of rank 0's
replica between syncs. The target is the anchor's last mean. A run's time to target is
the ``wall_seconds`` of its first line whose mean (over a full window) is at most the
target; the ratio is the anchor's time over the run's (> 1: sooner). A run that never
gets there has no ratio. Each row also states the median seconds per step and the final
test loss (the held-out windows, after the last step).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from disttrain.comm.errors import UsageError

__all__ = ["add_arguments", "mean_curve", "run", "time_to_loss"]

NAME = "dtttl"
PORT = 29533


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rates", default="100mbit,10gbit", help="link rates, one cluster each")
    p.add_argument("--hosts", type=int, default=4, help="hosts, one worker each (at least 2)")
    p.add_argument(
        "--strategies",
        default="allreduce:ring, diloco:period=50:algorithm=ring",
        help="compare's spec list; the first is the anchor whose final loss is the target",
    )
    p.add_argument(
        "--workload",
        choices=("diloco", "digits"),
        default="diloco",
        help="talking-less's workload of that name (gpt/pycode or mlp/digits)",
    )
    p.add_argument("--max-steps", type=int, default=300, help="steps of every run")
    p.add_argument("--log-every", type=int, default=5, help="a metrics line every N steps")
    p.add_argument("--window", type=int, default=50, help="steps in the trailing loss mean")
    p.add_argument("--run-timeout", type=float, default=900.0, help="seconds one run may take")
    p.add_argument("--json", dest="json_path", default="", help="write every figure here")


def mean_curve(lines: list[dict[str, Any]], window_lines: int) -> list[tuple[int, float, float]]:
    """(step, wall seconds, trailing mean loss) at each step line with a full window behind it."""
    steps = [m for m in lines if "loss" in m and "wall_seconds" in m]
    out = []
    for i in range(window_lines - 1, len(steps)):
        chunk = steps[i - window_lines + 1 : i + 1]
        mean = sum(float(m["loss"]) for m in chunk) / window_lines
        out.append((int(steps[i]["step"]), float(steps[i]["wall_seconds"]), mean))
    return out


def time_to_loss(curve: list[tuple[int, float, float]], target: float) -> tuple[int, float] | None:
    """(step, wall seconds) of the first point of ``curve`` at or below ``target``, else None."""
    for step, wall, loss in curve:
        if loss <= target:
            return step, wall
    return None


def _workload(args: argparse.Namespace) -> dict[str, Any]:
    """The train flags of every run: talking-less's workload, then this bench's own."""
    from disttrain.lab.bench.talking_less import base_flags
    from disttrain.launch.job import add_config_flags

    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    add_config_flags(parser)  # typed as `disttrain train` types them; only the ones given
    flags: dict[str, Any] = vars(parser.parse_args(base_flags(args.workload, None)))
    flags.update(max_steps=args.max_steps, log_every=args.log_every, workers=1)
    if args.workload == "digits":  # an optimizer the diloco strategy and allreduce share
        flags.update(optimizer="adam", lr=0.001)
    return flags


def _check(args: argparse.Namespace) -> tuple[list[str], list[Any]]:
    from disttrain import config
    from disttrain.cluster import netns
    from disttrain.launch.preflight import preflight
    from disttrain.strategies.spec import parse_specs

    rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    for r in rates:
        netns.parse_rate(r)
    if not rates or args.hosts < 2:
        raise UsageError("--rates needs at least one rate and --hosts at least 2")
    if args.max_steps < 1 or args.log_every < 1 or args.run_timeout <= 0:
        raise UsageError("--max-steps and --log-every must be >= 1, --run-timeout positive")
    if args.window < args.log_every or args.window % args.log_every:
        raise UsageError(f"--window {args.window} must be a multiple of --log-every")
    if args.window > args.max_steps:
        raise UsageError(f"--window {args.window} is longer than --max-steps {args.max_steps}")
    specs = parse_specs(args.strategies)
    if len(specs) < 2:
        raise UsageError("--strategies: give the anchor and at least one run to compare")
    common = _workload(args)
    for spec in specs:
        try:
            preflight(config.load({**spec.flags(common), "workers": args.hosts}))
        except UsageError as exc:
            raise UsageError(f"--strategies {spec.label!r}: {exc}") from None
    netns.check_tools()  # root and iproute2, else one line (exit 2)
    return rates, specs


def _one_rate(args: argparse.Namespace, rate: str, specs: list[Any]) -> list[dict[str, Any]]:
    """Train every spec on a fresh emulated cluster at ``rate``; their rows, timed to the
    anchor's (the first spec's) final mean loss (:func:`_time_to_anchor`)."""
    from disttrain.cluster import hosts as cluster
    from disttrain.launch.commands import train_run

    common = _workload(args)
    launcher = _launcher(args)
    rows = []
    c = cluster.plan(NAME, args.hosts, rate)
    cluster.down(NAME)
    cluster.up(c)
    try:
        for spec in specs:
            load = os.getloadavg()[0]
            summary = train_run(
                spec.flags(common), timeout=args.run_timeout + 60, launcher=launcher
            )
            rows.append(_row(args, rate, spec.label, summary, load))
            print(
                f"# {rate} {spec.label}: {rows[-1]['train_seconds']:.1f} s, test loss "
                f"{summary['final_test_loss']:.4f}, load {load:.1f}",
                flush=True,
            )
    finally:
        cluster.down(NAME)
    _time_to_anchor(rows)
    return rows


def _launcher(args: argparse.Namespace) -> list[str]:
    """``disttrain cluster run`` on this benchmark's cluster, port and timeout: what each
    training run is started under."""
    return [
        sys.executable,
        "-m",
        "disttrain",
        "cluster",
        "run",
        "--name",
        NAME,
        "--port",
        str(PORT),
        "--timeout",
        str(args.run_timeout),
        "--",
    ]


def _row(
    args: argparse.Namespace, rate: str, label: str, summary: dict[str, Any], load: float
) -> dict[str, Any]:
    """One run's row: its loss curve (means over ``--window`` steps), its training seconds,
    and its median seconds per step between logged lines; ``summary`` loses its metrics."""
    lines = summary.pop("metrics")
    walls = [m["wall_seconds"] for m in lines if "loss" in m]
    logged = [m["step"] for m in lines if "loss" in m]
    per_step = [
        (b - a) / (sb - sa)
        for a, b, sa, sb in zip(walls, walls[1:], logged, logged[1:], strict=False)
    ]
    return {
        "rate": rate,
        "label": label,
        "steps": summary["steps"],
        "curve": mean_curve(lines, args.window // args.log_every),
        "train_seconds": walls[-1] if walls else float("nan"),
        "seconds_per_step": statistics.median(per_step) if per_step else float("nan"),
        "final_test_loss": summary["final_test_loss"],
        "bytes_sent_per_rank": summary["bytes_sent_per_rank"],
        "load_start": load,
        "load_end": os.getloadavg()[0],
    }


def _time_to_anchor(rows: list[dict[str, Any]]) -> None:
    """Add to each row the time and step at which it reached the anchor's final mean loss,
    its speedup (the anchor's time over its own) and its best mean loss."""
    anchor = rows[0]
    target = anchor["curve"][-1][2] if anchor["curve"] else float("nan")
    base = time_to_loss(anchor["curve"], target)
    for r in rows:
        got = time_to_loss(r["curve"], target)
        r["target"] = target
        r["time_to_target"] = got[1] if got else None
        r["step_at_target"] = got[0] if got else None
        r["speedup"] = base[1] / got[1] if got and base and got[1] > 0 else None
        r["best_mean_loss"] = min((c[2] for c in r["curve"]), default=float("nan"))


def _print(rows: list[dict[str, Any]], window: int) -> None:
    print(
        f"\n| rate | run | s/step | train s | final mean loss ({window} steps) | best mean "
        "| time to anchor's final loss | sooner than anchor | final test loss | load |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        final = r["curve"][-1][2] if r["curve"] else float("nan")
        reach = (
            f"{r['time_to_target']:.1f} s (step {r['step_at_target']})"
            if r["time_to_target"] is not None
            else "not reached"
        )
        ratio = f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-"
        print(
            f"| {r['rate']} | {r['label']} | {r['seconds_per_step']:.3f} "
            f"| {r['train_seconds']:.1f} | {final:.4f} | {r['best_mean_loss']:.4f} | {reach} "
            f"| {ratio} | {r['final_test_loss']:.4f} "
            f"| {r['load_start']:.1f}-{r['load_end']:.1f} |"
        )


def run(args: argparse.Namespace) -> int:
    rates, specs = _check(args)
    rows: list[dict[str, Any]] = []
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, {args.hosts} hosts x 1 "
        f"worker, {args.workload}, {args.max_steps} steps, load {os.getloadavg()}",
        flush=True,
    )
    for rate in rates:
        try:
            rows += _one_rate(args, rate, specs)
        except (subprocess.SubprocessError, OSError, RuntimeError) as exc:
            print(f"cluster-time-to-loss: {rate}: a run failed: {exc}", file=sys.stderr)
            return 1
    _print(rows, args.window)
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(
                {
                    "command": "bench cluster-time-to-loss",
                    "hosts": args.hosts,
                    "workload": args.workload,
                    "max_steps": args.max_steps,
                    "rows": rows,
                },
                fh,
                indent=1,
            )
    return 0
