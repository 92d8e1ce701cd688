"""``disttrain train`` through the engine (train/engine.py) against the trainer before it.

Issue 49's "Speed": the trainer's loop became a client of the engine ``dt.distribute``
returns; its samples/s must stay within 2 % of the loop before the switch. Two source
trees (``--before``: a checkout of the commit before, e.g. ``git worktree add /tmp/before
977ca35``; ``--after``: this one), one strategy at a time, runs alternating between the
trees round after round (ABBA order, so a drift of the machine's load hits both), each a
fresh ``python -m disttrain train`` with ``PYTHONPATH`` set to the tree's ``src``. The
figure is the median of the per-round ratios after/before of summary.json's
``samples_per_second``, with its quartiles.

    .venv/bin/python benchmarks/engine_switch.py --before /tmp/before --after . --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
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


def _samples_per_second(tree: Path, flags: list[str], args: argparse.Namespace) -> float:
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "PYTHONPATH": str(tree.resolve() / "src")}
        cmd = [sys.executable, "-m", "disttrain", "train", "--workers", str(args.workers)]
        cmd += ["--epochs", str(args.epochs), "--no-progress", "--out", out, *flags]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"{tree}: {' '.join(flags)}: {done.stderr[-2000:]}")
        return float(json.loads((Path(out) / "summary.json").read_text())["samples_per_second"])


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
    args = p.parse_args()
    rows = {}
    for name in args.only.split(","):
        ratios, before, after = [], [], []
        for r in range(args.rounds):
            order = [args.before, args.after] if r % 2 == 0 else [args.after, args.before]
            got = {tree: _samples_per_second(tree, STRATEGIES[name], args) for tree in order}
            before.append(got[args.before])
            after.append(got[args.after])
            ratios.append(got[args.after] / got[args.before])
        p25, med, p75 = _quartiles(ratios)
        rows[name] = dict(ratio=med, p25=p25, p75=p75, before=before, after=after)
        print(
            f"{name:10s} after/before {med:.3f} [{p25:.3f}, {p75:.3f}]  "
            f"samples/s before {statistics.median(before):.0f} after "
            f"{statistics.median(after):.0f}",
            flush=True,
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
