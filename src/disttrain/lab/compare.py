"""``disttrain compare``: the same workload under several strategies, one report.

    disttrain compare --strategies "allreduce:ring, ps:async, localsgd:period=16, \\
        decentralized:onebit" --workers 4 --dataset digits --model mlp --epochs 10 --out DIR

Every run is a ``disttrain train`` subprocess (:func:`disttrain.launch.commands.train_run`)
with the same flags (so the same seed, data and batch), changed only by its
spec (grammar in :mod:`disttrain.strategies.spec`); any other train flag given
here (``--straggler``, ``--batch-size``, ``--lr``, ...) goes to every run.
With ``--tensorboard DIR`` every run writes its scalars to ``DIR/<n>-<spec>``: one
TensorBoard folder, one run each. Runs go one after another, never at once, so they
do not compete for the CPU.
``--cluster NAME`` runs each one as a multi-node job on the emulated cluster
(``disttrain cluster run``), ``--workers`` being the total, split evenly over
its hosts. All specs and flags are checked before the first run starts (exit
2); a run that fails is reported as failed and the others still run (exit 1).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from typing import Any

from disttrain.comm.errors import UsageError
from disttrain.lab.report import RunResult, print_results, write_report
from disttrain.strategies.spec import RunSpec, parse_specs

__all__ = ["add_arguments", "algorithms_table", "run", "table_algorithms"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """compare's own flags, then every train flag (``--out`` included) for every run."""
    from disttrain.launch.job import add_config_flags

    parser.description = (
        "Train the same workload under each of --strategies; write DIR/report.md "
        "and report.html (see docs/lab.md). Train flags given here go to every run."
    )
    parser.argument_default = argparse.SUPPRESS
    parser.usage = "%(prog)s --strategies SPECS [compare's options] [train's options]"
    parser.add_argument(
        "--strategies",
        required=True,
        help="comma-separated strategy[:value][:key=value...], e.g. "
        "'allreduce:ring, ps:async, localsgd:period=16, decentralized:onebit'",
    )
    parser.add_argument(
        "--target", type=float, default=0.9, help="test accuracy for time-to-target (default 0.9)"
    )
    parser.add_argument(
        "--cluster",
        default="",
        metavar="NAME",
        help="run each job on this emulated cluster (`disttrain cluster up` first; needs root)",
    )
    parser.add_argument(
        "--run-timeout", type=float, default=1800.0, help="seconds one run may take (default 1800)"
    )
    parser.add_argument(
        "--algorithms-table",
        action="store_true",
        default=False,  # the compare parser suppresses defaults not given explicitly
        help="also measure one allreduce per algorithm of the seed lectures' table (star, tree, "
        "butterfly, ring, and any algorithm that sets table_position) on --workers",
    )
    parser.add_argument(
        "--table-size", default="1MB", help="tensor size for --algorithms-table (default 1MB)"
    )
    add_config_flags(parser)


def table_algorithms() -> list[str]:
    """The algorithms of the seed lectures' table, in its order (each class's table_position)."""
    from disttrain import collectives

    rows = [(a.table_position, name) for name, a in collectives.ALGORITHMS.items()]
    return [name for position, name in sorted(rows) if position]


def algorithms_table(workers: int, size: str) -> list[dict[str, Any]]:
    """Measure one allreduce per algorithm with ``disttrain bench allreduce``'s code; table rows."""
    from disttrain import collectives
    from disttrain.collectives.paths import steps_formula
    from disttrain.lab.bench import allreduce as bench_allreduce

    parser = argparse.ArgumentParser()
    bench_allreduce.add_arguments(parser)
    names = ",".join(table_algorithms())
    args = parser.parse_args(
        [
            "--workers",
            str(workers),
            "--sizes",
            size,
            "--algorithms",
            names,
            "--warmup",
            "1",
            "--iters",
            "3",
            "--no-length-check",
            "--no-progress",
        ]
    )
    rows = []
    for r in bench_allreduce.measure(args):
        # an estimated one's bytes are the backend's documented cost, not observed
        if collectives.ALGORITHMS.get(r["algorithm"]).estimated:
            continue
        rows.append(
            {
                "algorithm": r["algorithm"],
                "ranks": r["workers"],
                "S (bytes)": r["size"],
                "bytes/rank (meter)": r["bytes_sent_measured"],
                "x S": f"{r['bytes_sent_measured'] / r['size']:.2f}",
                "bytes/rank (cost())": r["bytes_sent_theory"],
                "messages/rank (meter)": r["messages_measured"],
                "messages/rank (cost())": r["messages_theory"],
                "steps (formula)": steps_formula(r["algorithm"], r["workers"]),
                "median ms": f"{r['time_median_s'] * 1e3:.2f}",
                "bytes copied/rank (meter)": r["bytes_copied_measured"],
                "bytes copied/rank (cost())": r["bytes_copied_theory"],
            }
        )
    return rows


def _common_flags(ns: argparse.Namespace) -> dict[str, Any]:
    """The train flags given to compare (argparse suppressed the ones not given)."""
    from disttrain.config import section_fields

    flags = {k: v for k, v in vars(ns).items() if k in section_fields()}
    for name in ("strategy", "nnodes", "node_rank", "rdzv_endpoint", "config"):
        if name in flags:
            raise UsageError(
                f"--{name.replace('_', '-')} cannot be given to compare: "
                "name strategies in --strategies; use --cluster for multi-node runs"
            )
    flags.pop("out", None)
    flags.pop("progress", None)
    return flags


def _check_out(out: str, overwrite: bool) -> None:
    """An ``--out`` holding an earlier comparison is refused, as ``train`` refuses one
    holding an earlier run's results: its report would be replaced by this one's."""
    earlier = [
        n for n in ("report.md", "runs.json", "runs") if os.path.exists(os.path.join(out, n))
    ]
    if earlier and not overwrite:
        raise UsageError(
            f"--out {out} already holds an earlier comparison ({', '.join(earlier)}): "
            "choose another --out, or give --overwrite to replace it"
        )


def _check_runs(specs: list[RunSpec], common: dict[str, Any]) -> None:
    """Each run's settings through the same checks ``disttrain train`` makes (UsageError)."""
    from disttrain import config
    from disttrain.launch.preflight import preflight

    for spec in specs:
        try:
            preflight(config.load(spec.flags(common)))
        except UsageError as exc:
            raise UsageError(f"--strategies {spec.label!r}: {exc}") from None


def _cluster_launcher(name: str, workers: int, timeout: float) -> tuple[list[str], int, str]:
    """(launcher command, workers per host, a description) for ``--cluster NAME``."""
    from disttrain.cluster import hosts as cluster
    from disttrain.cluster import netns

    netns.check_tools()
    layout = cluster.load(name)
    if layout is None:
        raise UsageError(f"--cluster {name}: not up; `disttrain cluster up --hosts N` first")
    hosts = len(layout.hosts)
    if workers % hosts:
        raise UsageError(f"--workers {workers} is not a multiple of the cluster's {hosts} hosts")
    launcher = [
        sys.executable,
        "-m",
        "disttrain",
        "cluster",
        "run",
        "--name",
        name,
        "--timeout",
        str(timeout),
        "--",
    ]
    about = f"emulated cluster {name!r}: {hosts} hosts x {workers // hosts} workers, "
    about += f"{layout.rate_bits / 1e6:g} Mbit/s per host link (tbf), no added latency"
    return launcher, workers // hosts, about


def _run_folder(index: int, label: str) -> str:
    """A TensorBoard run's folder name for spec ``label``: ``2-ps_async``."""
    return f"{index}-" + re.sub(r"[^\w.=-]+", "_", label).strip("_")


def _meta(
    ns: argparse.Namespace, argv: list[str], common: dict[str, Any], net: str
) -> dict[str, Any]:
    load = os.getloadavg()
    return {
        "command": "disttrain " + shlex.join(argv),
        "date (UTC)": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "network": net,
        "flags common to every run": " ".join(f"{k}={v}" for k, v in sorted(common.items()))
        or "(defaults)",
        "load average at start (1/5/15 min)": f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}",
        "CPUs": os.cpu_count(),
        "target": f"test accuracy {ns.target:g}",
    }


def _run_one(
    i: int,
    spec: RunSpec,
    common: dict[str, Any],
    board: str,
    out: str,
    run_timeout: float,
    launcher: list[str],
) -> tuple[RunResult, str]:
    """Train spec number ``i`` into its own folder under the report's; with its status, done
    or FAILED (its exit, an OSError, the timeout: the error instead of a summary)."""
    from disttrain.launch import commands

    flags = spec.flags(common)
    if board:  # one TensorBoard folder, one run (sub-folder) per spec
        flags["tensorboard"] = os.path.join(board, _run_folder(i, spec.label))
    try:
        # on the cluster, `cluster run --timeout` stops the nodes first and cleans up
        limit = run_timeout + (60 if launcher else 0)
        # each run's own folder stays, under the report's: runs.json points to it
        folder = os.path.join(out, "runs", f"run-{i:02d}")
        summary = commands.train_run(flags, timeout=limit, launcher=launcher, out=folder)
        return RunResult(spec.label, flags, summary, folder=folder), "done"
    except (commands.RunFailed, OSError, subprocess.TimeoutExpired) as exc:
        return RunResult(spec.label, flags, None, str(exc), folder=folder), "FAILED"


def run(ns: argparse.Namespace, argv: list[str]) -> int:
    """Check everything, run each spec in turn, write the report; 0 if every run succeeded."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    specs = parse_specs(ns.strategies)
    common = _common_flags(ns)
    if not 0 < ns.target <= 1 or ns.run_timeout <= 0:
        raise UsageError("--target must be in (0, 1] and --run-timeout positive")
    out = getattr(ns, "out", "") or os.path.join("runs", time.strftime("%Y%m%d-%H%M%S-compare"))
    workers = int(common.get("workers", 2))
    board = common.pop("tensorboard", "")
    _check_runs(specs, common)
    launcher: list[str] = []
    net = "this machine, loopback (one node)"
    given = common  # the report states the total workers, the network line the split
    if ns.cluster:
        launcher, per_host, net = _cluster_launcher(ns.cluster, workers, ns.run_timeout)
        common = {**common, "workers": per_host}
    if ns.algorithms_table:
        from disttrain.lab.bench.allreduce import parse_size

        parse_size(ns.table_size)
    _check_out(out, bool(common.get("overwrite")))
    os.makedirs(out, exist_ok=True)
    meta = _meta(ns, argv, given, net)
    results: list[RunResult] = []
    show = getattr(ns, "progress", True) and sys.stderr.isatty()
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, disable=not show, transient=False) as progress:
        for i, spec in enumerate(specs, 1):
            task = progress.add_task(f"run {i}/{len(specs)}: {spec.label}", total=1)
            if not show:
                print(f"compare: run {i}/{len(specs)}: {spec.label}", file=sys.stderr)
            result, status = _run_one(i, spec, common, board, out, ns.run_timeout, launcher)
            results.append(result)
            progress.update(
                task, completed=1, description=f"run {i}/{len(specs)}: {spec.label}: {status}"
            )
        algorithms: list[dict[str, Any]] = []
        if ns.algorithms_table:
            progress.add_task(f"allreduce algorithms table on {workers} ranks", total=None)
            algorithms = algorithms_table(workers, ns.table_size)
    load = os.getloadavg()
    meta["load average at end"] = f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}"
    paths = write_report(out, results, ns.target, meta, algorithms)
    print_results(results, ns.target)
    print(f"compare: wrote {paths['md']} and {paths['html']}")
    failed = [r for r in results if r.summary is None]
    for r in failed:
        print(f"compare: {r.label} failed: {r.error}", file=sys.stderr)
    return 1 if failed else 0
