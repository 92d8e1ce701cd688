"""Time every allreduce algorithm against the backend's own, nccl-tests style.

    disttrain bench allreduce --workers 4 --sizes 4KB,1MB,16MB,64MB --algorithms all --json out.json

N ranks are spawned on this host (file store, gloo pinned to the loopback
interface, one torch thread each). For every size: ``--warmup`` untimed calls
of each algorithm, then ``--iters`` rounds in which every algorithm makes one
timed call (interleaved, so that all see the same load), each started after a
barrier and timed as the slowest rank's wall time. Reported: median time and its spread
(10th and 90th percentile), algbw = S/t, busbw = algbw·2(n-1)/n (nccl-tests'
definitions), the bytes one rank sent in one call as the meter counted them and
as the algorithm's cost states (the most of any rank), busbw as a ratio
of ``native``'s measured in the same run, and "paired": the median over rounds
of the call's time over native's in the same round. Every timed call's result is
checked (n ones summed must give n everywhere): a wrong sum ends the run naming the
algorithm. Bytes copied through shared memory (``shm``) are counted apart from bytes
sent, measured and stated.

The physical limits are measured in the same run, by rank 0 while the others wait
(:mod:`._limits`): the single-thread memory-copy bandwidth and the loopback TCP
bandwidth; each row gives its busbw as a fraction of both.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from typing import TYPE_CHECKING, Any

from disttrain.comm.errors import UsageError

if TYPE_CHECKING:
    import torch

__all__ = [
    "add_arguments",
    "measure",
    "measure_in_world",
    "parse_size",
    "print_rows",
    "run",
    "validate",
]

_UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
_DTYPES = ("float32", "float64", "bfloat16", "float16", "int64")
#: The backend's own allreduce: always measured, first, and every ratio refers to it.
ANCHOR = "native"


def parse_size(text: str) -> int:
    """``4KB`` -> 4096 (binary units B, KB, MB, GB); raises UsageError."""
    t = text.strip().upper()
    for unit in sorted(_UNITS, key=len, reverse=True):
        if t.endswith(unit):
            number = t[: -len(unit)]
            break
    else:
        unit, number = "B", t
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        raise UsageError(f"--sizes: cannot read {text!r}; write e.g. 4KB,1MB,16MB") from None
    if value <= 0 or value > 4 * _UNITS["GB"]:
        raise UsageError(f"--sizes: {text!r} must be above 0 and at most 4GB")
    return int(value)


def _label(nbytes: int) -> str:
    for unit in ("GB", "MB", "KB"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return f"{nbytes}B"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=2, help="ranks to spawn (default: 2)")
    parser.add_argument("--sizes", default="4KB,1MB,16MB,64MB", help="comma-separated sizes")
    parser.add_argument(
        "--algorithms", default="all", help="comma-separated names, or all (native included)"
    )
    parser.add_argument("--dtype", default="float32", choices=_DTYPES)
    parser.add_argument(
        "--inter-algorithm", default="ring", help="hierarchical's algorithm between hosts"
    )
    parser.add_argument(
        "--allreduce-table",
        default="",
        help="auto's table, SIZE:NAME,...,*:NAME (default: the cost model's for these ranks)",
    )
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls (default: 5)")
    parser.add_argument("--iters", type=int, default=20, help="timed calls (default: 20)")
    parser.add_argument(
        "--length-check",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="check every call's length on all ranks first (one extra 16-byte collective); "
        "off by default, as in training (--check-collectives)",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per collective")
    parser.add_argument("--json", dest="json_path", default="", help="also write the rows here")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def validate(args: argparse.Namespace) -> tuple[list[int], list[str]]:
    from disttrain import collectives

    if not 1 <= args.workers <= 64:
        raise UsageError(f"--workers {args.workers}: use 1 to 64")
    if args.iters < 1 or args.warmup < 0:
        raise UsageError("--iters must be at least 1 and --warmup at least 0")
    if args.timeout <= 0:
        raise UsageError("--timeout must be positive")
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if not sizes:
        raise UsageError("--sizes: give at least one size")
    if args.algorithms.strip() == "all":
        names = list(collectives.ALGORITHMS)
    else:
        names = [a.strip() for a in args.algorithms.split(",") if a.strip()]
        unknown = [a for a in names if a not in collectives.ALGORITHMS]
        if unknown or not names:
            raise UsageError(
                f"--algorithms: unknown {', '.join(unknown) or '(none given)'}; "
                f"choose from all, {', '.join(collectives.ALGORITHMS)}"
            )
    names = [ANCHOR] + [a for a in dict.fromkeys(names) if a != ANCHOR]
    choosers = [n for n in names if collectives.chooses(n)]
    if args.allreduce_table and not choosers:  # nothing would read it
        raise UsageError("--allreduce-table is read only by --algorithms auto")
    if choosers and args.allreduce_table:
        print(f"{choosers[0]}: {args.allreduce_table} (given)")
    elif choosers:  # as the launcher chooses it
        from disttrain import calibration, costing

        cal = calibration.for_choosing()  # as the launcher does
        args.allreduce_table = costing.allreduce_table(args.workers, 1, cal)
        print(f"{choosers[0]}: {args.allreduce_table} (the cost model, {cal.source})")
    for name in names:  # their settings (--inter-algorithm) checked here: one line, exit 2
        collectives.ALGORITHMS.get(name).settings(vars(args))
    folder = os.path.dirname(os.path.abspath(args.json_path)) if args.json_path else ""
    if folder and not os.path.isdir(folder):
        raise UsageError(f"--json: folder {folder} does not exist")
    return sizes, names


def measure_in_world(
    sizes: list[int], names: list[str], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Run on every rank of a formed group (spawned here, or a cluster's torchrun); rank 0
    returns the rows."""
    import torch
    import torch.distributed as dist

    from disttrain import collectives

    n, rank = dist.get_world_size(), dist.get_rank()
    itemsize = torch.empty(0, dtype=getattr(torch, args.dtype)).element_size()
    collectives.set_length_check(args.length_check)
    progress: Any = None
    if rank == 0 and not args.no_progress:
        from rich.progress import Progress

        progress = Progress(transient=True)
        progress.start()
        task = progress.add_task(f"allreduce on {n} ranks", total=len(sizes) * args.iters)
    else:
        task = None
    rows: list[dict[str, Any]] = []
    limits = torch.zeros(2, dtype=torch.float64)
    dist.barrier()
    if rank == 0:  # the others wait in the barrier below (blocked, not spinning)
        from disttrain.lab.bench._limits import loopback_tcp_GBps, memcpy_GBps

        limits[0], limits[1] = memcpy_GBps(), loopback_tcp_GBps()
    dist.barrier()
    try:
        for nbytes in sizes:
            rows += _measure_size(nbytes // itemsize, names, args, progress, task)
    finally:
        if progress is not None:
            progress.stop()
    for row in rows:
        anchor = next(r for r in rows if r["size"] == row["size"] and r["algorithm"] == ANCHOR)
        row["busbw_vs_native"] = (
            row["busbw_GBps"] / anchor["busbw_GBps"] if anchor["busbw_GBps"] else None
        )
        row["time_vs_native"] = row["time_median_s"] / anchor["time_median_s"]
        # Per-iteration ratio against the native call made in the same round
        # (moments apart), then the median: robust to load that drifts during a run.
        paired = [t / a for t, a in zip(row.pop("times"), anchor["times_anchor"], strict=True)]
        row["time_vs_native_paired"] = statistics.median(paired)
        row["memcpy_GBps"], row["loopback_tcp_GBps"] = float(limits[0]), float(limits[1])
        row["busbw_vs_memcpy"] = row["busbw_GBps"] / float(limits[0]) if rank == 0 else None
        row["busbw_vs_tcp"] = row["busbw_GBps"] / float(limits[1]) if rank == 0 else None
    for row in rows:
        row.pop("times_anchor", None)
    return rows


def _measure_size(
    numel: int, names: list[str], args: argparse.Namespace, progress: Any, task: Any
) -> list[dict[str, Any]]:
    """Time every algorithm on ``numel`` elements, interleaved; rank 0 returns the rows.

    Interleaved: round i runs each algorithm once (in an order shuffled by i),
    so every algorithm sees the same load as its native anchor, instead of
    each taking its ``--iters`` calls in a block while the load drifts.
    """
    import torch
    import torch.distributed as dist

    from disttrain import collectives
    from disttrain.collectives.checks import check_cost_bytes

    n, rank = dist.get_world_size(), dist.get_rank()
    dtype = getattr(torch, args.dtype)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    # each configured by the bench's flags of its settings (hierarchical: --inter-algorithm)
    algos = [collectives.ALGORITHMS.get(name).build(vars(args)) for name in names]
    x = torch.ones(numel, dtype=dtype)
    for algo in algos:
        for _ in range(args.warmup):
            algo.all_reduce(x)
            x.fill_(1)  # keep values small: repeated sums would overflow low precision
    times, sent = _interleaved_rounds(algos, names, x, args.iters, progress, task)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    dist.all_reduce(sent, op=dist.ReduceOp.MAX)
    if rank != 0:
        return []
    check = check_cost_bytes(n) if args.length_check else (0, 0)
    rows = []
    for k, name in enumerate(names):
        row = _row(
            name,
            numel * itemsize,
            n,
            times[k].tolist(),
            sent[k].tolist(),
            algos[k],
            itemsize,
            check,
        )
        row["times"] = times[k].tolist()
        if name == ANCHOR:
            row["times_anchor"] = times[k].tolist()
        rows.append(row)
    return rows


def _interleaved_rounds(
    algos: list[Any], names: list[str], x: torch.Tensor, iters: int, progress: Any, task: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """``iters`` rounds, each calling every algorithm once on ``x`` in an order shuffled by the
    round (the same on every rank: seeded by the round's number; a rotation kept the cyclic
    order, so one algorithm always ran right after native and paid for it); returns this
    rank's seconds (algorithm × round) and the meter's (bytes sent, messages sent, bytes
    copied) of each algorithm's last call.

    Each call starts after a barrier on a tensor of ones, and its sum must be n ones exactly.
    """
    import torch
    import torch.distributed as dist

    from disttrain.comm import meter

    n, rank = dist.get_world_size(), dist.get_rank()
    nbytes = x.numel() * x.element_size()
    times = torch.zeros(len(names), iters, dtype=torch.float64)
    sent = torch.zeros(len(names), 3, dtype=torch.int64)
    for i in range(iters):
        if progress is not None:
            progress.update(task, description=f"{_label(nbytes)} round {i + 1}")
        for k in random.Random(i).sample(range(len(names)), len(names)):
            x.fill_(1)
            dist.barrier()
            meter.reset()
            start = time.perf_counter()
            algos[k].all_reduce(x)
            times[k, i] = time.perf_counter() - start
            sent[k] = torch.tensor([meter.bytes_sent, meter.messages_sent, meter.bytes_copied])
            if not bool((x == n).all()):  # n ones summed: exact in every dtype offered
                raise RuntimeError(f"{names[k]} gave a wrong sum on rank {rank} ({_label(nbytes)})")
        if progress is not None:
            progress.advance(task)
    return times, sent


def _row(
    name: str,
    nbytes: int,
    n: int,
    times: list[float],
    sent: list[int],
    algo: Any,
    itemsize: int,
    check: tuple[int, int],
) -> dict[str, Any]:
    from disttrain.collectives import ALGORITHMS

    median = statistics.median(times)
    qs = statistics.quantiles(times, n=10, method="inclusive") if len(times) > 1 else [median] * 9
    theory = [algo.cost(nbytes, n, r, itemsize) for r in range(n)]
    algbw = nbytes / median / 1e9
    return {
        "algorithm": name,
        "size": nbytes,
        "workers": n,
        "iters": len(times),
        "time_median_s": median,
        "time_p10_s": qs[0],
        "time_p90_s": qs[-1],
        "algbw_GBps": algbw,
        "busbw_GBps": algbw * 2 * (n - 1) / n,
        "bytes_sent_measured": sent[0],
        "bytes_sent_theory": max(c.bytes_sent for c in theory) + check[0],
        "messages_measured": sent[1],
        "messages_theory": max(c.messages for c in theory) + check[1],
        "bytes_copied_measured": sent[2],
        "bytes_copied_theory": max(c.bytes_copied for c in theory),
        "estimated": ALGORITHMS.get(algo.name).estimated,
    }


def _spawn(sizes: list[int], names: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    from disttrain.launch.spawn import run_world

    # no limit on the whole run (it grows with sizes, algorithms and iterations); a hung
    # call still ends at --timeout, the collectives' own limit
    per_rank = run_world(
        measure_in_world,
        args.workers,
        (sizes, names, args),
        timeout=None,
        collective_timeout=args.timeout,
    )
    return [row for rows in per_rank for row in rows]  # rank 0's rows; the others return none


def print_rows(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"allreduce on {args.workers} ranks, {args.dtype}, gloo over "
        f"{getattr(args, 'link', 'loopback')}, "
        f"{args.iters} iters after {args.warmup} warm-ups, length check "
        f"{'on' if args.length_check else 'off'}"
    )
    for col in (
        "size",
        "algorithm",
        "time (us)",
        "p10-p90 (us)",
        "algbw GB/s",
        "busbw GB/s",
        "sent B (meter)",
        "sent B (theory)",
        "busbw / native",
        "time / native",
        "paired",
        "busbw / memcpy",
        "busbw / tcp",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        ratio = r["busbw_vs_native"]
        table.add_row(
            _label(r["size"]),
            r["algorithm"],
            f"{r['time_median_s'] * 1e6:.0f}",
            f"{r['time_p10_s'] * 1e6:.0f}-{r['time_p90_s'] * 1e6:.0f}",
            f"{r['algbw_GBps']:.3f}",
            f"{r['busbw_GBps']:.3f}",
            f"{r['bytes_sent_measured']}{'*' if r['estimated'] else ''}",
            str(r["bytes_sent_theory"]),
            "-" if ratio is None else f"{ratio:.2f}",
            f"{r['time_vs_native']:.2f}",
            f"{r['time_vs_native_paired']:.2f}",
            f"{r['busbw_vs_memcpy']:.2f}",
            f"{r['busbw_vs_tcp']:.2f}",
        )
    Console(width=220).print(table)
    if rows:
        print(
            f"physical limits measured in this run: single-thread memory copy "
            f"{rows[0]['memcpy_GBps']:.2f} GB/s, loopback TCP {rows[0]['loopback_tcp_GBps']:.2f} "
            "GB/s (busbw / memcpy, busbw / tcp: fractions of them)"
        )
    copied = [r for r in rows if r["bytes_copied_theory"]]
    for r in copied:
        print(
            f"{r['algorithm']} {_label(r['size'])}: copied through shared memory "
            f"{r['bytes_copied_measured']} B (meter), "
            f"{r['bytes_copied_theory']} B (theory)"
        )
    print("* native's bytes are gloo's documented ring cost, not observed")
    print("paired: median over rounds of time / native's time in the same round (interleaved)")


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Check ``args`` (the flags of :func:`add_arguments`), spawn the ranks, return the rows."""
    sizes, names = validate(args)
    return _spawn(sizes, names, args)


def run(args: argparse.Namespace) -> int:
    rows = measure(args)
    print_rows(rows, args)
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(
                {
                    "command": "bench allreduce",
                    "workers": args.workers,
                    "dtype": args.dtype,
                    "length_check": args.length_check,
                    "rows": rows,
                },
                fh,
                indent=1,
            )
    return 0
