"""``disttrain train`` through the engine (train/engine.py) against the trainer before it.

Issue 49's "Speed": the trainer's loop became a client of the engine ``dt.distribute``
returns; its samples/s must stay within 2 % of the loop before the switch. Two source
trees (``--before``: a checkout of the commit before, e.g. ``git worktree add /tmp/before
977ca35``; ``--after``: this one), one strategy at a time, runs alternating between the
trees round after round (ABBA order, so a drift of the machine's load hits both), each a
fresh ``python -m disttrain train`` with ``PYTHONPATH`` set to the tree's ``src``. The
figure is the median of the per-round ratios after/before of summary.json's
``samples_per_second``, with its quartiles.

``--cpu``: also the CPU seconds the training itself took, load-insensitive where samples/s
is not (a shared machine's other processes take the cores, not the CPU-seconds a step
needs): each tree runs ``--epochs E`` and ``--epochs 1`` in the round, and the difference
of the two runs' process-tree CPU (``getrusage(RUSAGE_CHILDREN)``: the launcher reaps its
workers) is what E - 1 epochs of steps cost, start-up and pre-flight cancelled. Its figure
is before/after of that (above 1: the engine's steps are cheaper).

    .venv/bin/python benchmarks/engine_switch.py --before /tmp/before --after . --rounds 5
    .venv/bin/python benchmarks/engine_switch.py --before /tmp/before --epochs 3 --cpu
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

#: the strategies the issue names, each with the flags its run needs
STRATEGIES = {
    "allreduce": [],
    "zero-3": ["--strategy", "zero", "--zero-stage", "3"],
    "localsgd": ["--strategy", "localsgd"],
    "pipeline": ["--strategy", "pipeline"],
}


def _run(tree: Path, flags: list[str], workers: int, epochs: int) -> tuple[float, float]:
    """summary.json's samples/s of one run, and the CPU seconds of its process tree."""
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "PYTHONPATH": str(tree.resolve() / "src")}
        cmd = [sys.executable, "-m", "disttrain", "train", "--workers", str(workers)]
        cmd += ["--epochs", str(epochs), "--no-progress", "--out", out, *flags]
        was = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        now = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise SystemExit(f"{tree}: {' '.join(flags)}: {done.stderr[-2000:]}")
        cpu = now.ru_utime + now.ru_stime - was.ru_utime - was.ru_stime
        summary = json.loads((Path(out) / "summary.json").read_text())
        return float(summary["samples_per_second"]), cpu


def _measure(tree: Path, flags: list[str], args: argparse.Namespace) -> tuple[float, float]:
    """samples/s at --epochs, and (--cpu) the CPU seconds of its epochs after the first."""
    rate, cpu = _run(tree, flags, args.workers, args.epochs)
    if not args.cpu:
        return rate, float("nan")
    return rate, cpu - _run(tree, flags, args.workers, 1)[1]


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, required=True)
    p.add_argument("--after", type=Path, default=Path("."))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--only", default=",".join(STRATEGIES))
    p.add_argument("--cpu", action="store_true", help="also the training's CPU seconds")
    args = p.parse_args()
    if args.cpu and args.epochs < 2:
        p.error("--cpu needs --epochs 2 or more (the epochs after the first are measured)")
    rows = {name: _strategy(name, args) for name in args.only.split(",")}
    print(json.dumps(rows))


def _strategy(name: str, args: argparse.Namespace) -> dict[str, object]:
    """Rounds of both trees (ABBA); the ratios' median and quartiles, printed as a line."""
    got: dict[Path, list[tuple[float, float]]] = {args.before: [], args.after: []}
    for r in range(args.rounds):
        order = [args.before, args.after] if r % 2 == 0 else [args.after, args.before]
        for tree in order:
            got[tree].append(_measure(tree, STRATEGIES[name], args))
    (before, cpu_b), (after, cpu_a) = (zip(*got[t], strict=True) for t in (args.before, args.after))
    p25, med, p75 = _quartiles([a / b for a, b in zip(after, before, strict=True)])
    row: dict[str, object] = dict(ratio=med, p25=p25, p75=p75, before=before, after=after)
    line = (
        f"{name:10s} after/before {med:.3f} [{p25:.3f}, {p75:.3f}]  samples/s before "
        f"{statistics.median(before):.0f} after {statistics.median(after):.0f}"
    )
    if args.cpu:
        c25, cmed, c75 = _quartiles([b / a for a, b in zip(cpu_a, cpu_b, strict=True)])
        row.update(cpu_ratio=cmed, cpu_p25=c25, cpu_p75=c75, cpu_before=cpu_b, cpu_after=cpu_a)
        line += f"  CPU before/after {cmed:.3f} [{c25:.3f}, {c75:.3f}]"
    print(line, flush=True)
    return row


if __name__ == "__main__":
    main()
