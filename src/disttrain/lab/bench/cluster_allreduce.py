"""Allreduce algorithms across emulated hosts: several ranks per host, a shaped link each.

    sudo disttrain bench cluster-allreduce --hosts 2 --ranks-per-host 2 --rate 1gbit \\
        --sizes 16MB,64MB --algorithms ring,hierarchical --json out.json

``cluster up`` makes H hosts (network namespaces) joined by a bridge, each host's link
shaped to ``--rate``; a link probe measures the TCP goodput between two hosts; then each
host runs ``torchrun --nnodes H --nproc-per-node P`` (ranks of one host share its
namespace, so shared memory and loopback stay inside it, as on a real host) and the ranks
time every algorithm as ``disttrain bench allreduce`` does: interleaved rounds, each call
timed as the slowest rank's wall time, busbw = S/t·2(n−1)/n over all n = H·P ranks, every
row also as a ratio of ``native``'s in the same run. The question this answers: how much
does an algorithm that crosses each host's link once (``hierarchical``) gain over a flat
one whose ring crosses it with every rank's share (``ring``)? On H hosts of P ranks a flat
ring sends 2(n−1)/n·S over each host's link, the hierarchical 2(H−1)/H·S: at most
(n−1)/n · H/(H−1) times less (1.5 for 2 × 2).

``--ranks-per-host`` may be a list (``3,1``): hosts with unequal rank counts. Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from typing import Any

from disttrain import collectives
from disttrain.comm.errors import UsageError
from disttrain.lab.bench import allreduce as bench_allreduce

__all__ = ["add_arguments", "run"]

NAME = "dtcar"
PORT = 29531


def add_arguments(p: argparse.ArgumentParser) -> None:
    bench_allreduce.add_arguments(p)
    # --workers is --hosts × --ranks-per-host here: given, it is refused
    p.set_defaults(
        sizes="16MB,64MB", algorithms="ring,hierarchical", iters=5, warmup=1, workers=None
    )
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument(
        "--ranks-per-host", default="2", help="ranks on each host: one number, or one per host"
    )
    p.add_argument("--rate", default="1gbit", help="each host's link (tc tbf), e.g. 1gbit")
    p.add_argument("--worker-json", default="", help=argparse.SUPPRESS)  # a rank's own run


def _layout(args: argparse.Namespace) -> list[int]:
    try:
        per = [int(x) for x in str(args.ranks_per_host).split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--ranks-per-host {args.ranks_per_host}: give whole numbers") from None
    if len(per) == 1:
        per *= args.hosts
    if len(per) != args.hosts or min(per) < 1 or args.hosts < 2:
        raise UsageError(
            f"--ranks-per-host {args.ranks_per_host}: one count >= 1, or one per host "
            f"(--hosts {args.hosts}, at least 2)"
        )
    return per


def _rank_flags(args: argparse.Namespace) -> list[str]:
    """The flags each rank measures with: the parsed ones, spelled out again."""
    return [
        "--sizes",
        args.sizes,
        "--algorithms",
        args.algorithms,
        "--dtype",
        args.dtype,
        "--inter-algorithm",
        args.inter_algorithm,
        "--warmup",
        str(args.warmup),
        "--iters",
        str(args.iters),
        "--timeout",
        str(args.timeout),
        "--no-progress",
        "--length-check" if args.length_check else "--no-length-check",
        *(["--allreduce-table", args.allreduce_table] if args.allreduce_table else []),
    ]


def _node_script(args: argparse.Namespace, per: list[int], out: str) -> str:
    """What each host runs: its torchrun agent (node rank and master from the cluster)."""
    agent = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(args.hosts),
        "--rdzv-backend",
        "c10d",
        "--rdzv-id",
        f"{NAME}-{os.getpid()}",
    ]
    counts = " ".join(str(p) for p in per)  # this host's count: the list's entry at its rank
    bench = [
        "-m",
        "disttrain.lab.bench.cluster_allreduce",
        *_rank_flags(args),
        "--worker-json",
        out,
    ]
    return (
        f'set -- {counts}; shift "$DISTTRAIN_CLUSTER_NODE_RANK"; '
        f'exec {shlex.join(agent)} --nproc-per-node "$1" '
        f'--rdzv-endpoint "$DISTTRAIN_CLUSTER_MASTER" {shlex.join(bench)}'
    )


def run(args: argparse.Namespace) -> int:
    if args.worker_json:
        return _worker(args)
    from disttrain.cluster import hosts as cluster
    from disttrain.cluster import linkprobe, netns

    if args.workers is not None:
        raise UsageError("--workers: the ranks here are --hosts x --ranks-per-host")
    per = _layout(args)
    args.workers = sum(per)
    names = [a.strip() for a in args.algorithms.split(",")]
    if any(n in collectives.ALGORITHMS and collectives.chooses(n) for n in names) and not (
        args.allreduce_table
    ):
        # bench allreduce's table is one host's; across hosts the launcher chooses otherwise
        raise UsageError(
            "--algorithms auto across hosts: give its table, --allreduce-table SIZE:NAME,...,"
            "*:NAME (what the launcher takes: docs/collectives.md, '--algorithm auto')"
        )
    netns.check_tools()  # root and iproute2, else one line (exit 2)
    bench_allreduce.validate(args)
    out = os.path.join(tempfile.mkdtemp(prefix="dt-car-"), "rows.json")
    c = cluster.plan(NAME, args.hosts, args.rate)
    cluster.down(NAME)
    cluster.up(c)
    try:
        link = linkprobe.measure(c.hosts[0], c.hosts[1], c.rate_bits, seconds=1.0)
        print(
            f"cluster: {args.hosts} hosts x {per} ranks, {args.rate} links "
            f"(goodput {link.bits_per_s / 1e6:.0f} Mbit/s)",
            flush=True,
        )
        proc = _run_on_hosts(_node_script(args, per, out))
        if proc.returncode != 0:
            print(f"cluster-allreduce: the hosts' run failed (exit {proc.returncode})")
            return 1
    finally:
        cluster.down(NAME)
    with open(out) as fh:
        rows: list[dict[str, Any]] = json.load(fh)
    args.link = f"{args.hosts} hosts' {args.rate} links ({per} ranks)"
    bench_allreduce.print_rows(rows, args)
    if args.json_path:
        _write_record(args, per, link.bits_per_s, rows)
    return 0


def _run_on_hosts(script: str) -> subprocess.CompletedProcess[bytes]:
    """``disttrain cluster run`` of the node script on every host (30 min, then stopped)."""
    from disttrain.cluster.command import run_args
    from disttrain.launch import commands

    return commands.run([*run_args(NAME, 1800, PORT), "sh", "-c", script], timeout=1900)


def _write_record(
    args: argparse.Namespace, per: list[int], goodput: float, rows: list[dict[str, Any]]
) -> None:
    """``--json``: the rows with the cluster's layout, rate and measured goodput."""
    with open(args.json_path, "w") as fh:
        record = {
            "command": "bench cluster-allreduce",
            "hosts": args.hosts,
            "ranks_per_host": per,
            "rate": args.rate,
            "goodput_bits_per_s": goodput,
            "rows": rows,
        }
        json.dump(record, fh, indent=1)


def _worker(args: argparse.Namespace) -> int:
    """One rank under the host's torchrun: form the job, time, rank 0 writes the rows."""
    from disttrain.comm import world

    world.init(timeout=args.timeout)
    args.workers = world.size()
    try:
        sizes, names = bench_allreduce.validate(args)
        rows = bench_allreduce.measure_in_world(sizes, names, args)
        if world.rank() == 0:
            with open(args.worker_json, "w") as fh:
                json.dump(rows, fh)
    finally:
        world.shutdown()
    return 0


if __name__ == "__main__":  # a rank started by a host's torchrun (see _node_script)
    parser = argparse.ArgumentParser(prog="cluster-allreduce worker")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
