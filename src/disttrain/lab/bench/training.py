"""Mixed precision and prefetching, each measured against its plain anchor in the same run.

    disttrain bench training precision [--repeats 2] [--fp16]
    disttrain bench training prefetch --delay-ms 20
    disttrain bench training algorithm [--workers 2,4] [--repeats 3]

``precision``: fp32 vs bf16 (and fp16) on digits/mlp and on gpt/pycode, 2
workers: final accuracy or loss, and samples/s as a ratio to fp32.
``prefetch``: a loader made deliberately slow (a sleep per batch, like I/O)
with prefetching off and on: the data wait per step and samples/s.
``algorithm``: the default run (``--algorithm auto``: the cost model's table) against
``--algorithm native`` (the backend's own), digits/mlp, 2 epochs: samples/s of each pair
and their ratio, the median over the pairs (issue 38: >= 1.25 at 2 workers, >= 1.0 at 4).
Runs alternate between variants so that load on the machine hits both alike (``algorithm``
also swaps which of a pair goes first).
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

__all__ = ["add_arguments", "run"]

DIGITS = {"dataset": "digits", "model": "mlp", "epochs": 10, "workers": 2}
GPT = {
    "dataset": "pycode",
    "model": "gpt",
    "epochs": 2,
    "workers": 2,
    "batch_size": 32,
    "lr": 0.003,
    "optimizer": "adam",
    "pycode_chars": 100_000,
}


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(float(r[key]) for r in runs)


def precision(repeats: int, fp16: bool) -> None:
    from disttrain.launch.commands import train_run

    variants = ["fp32", "bf16"] + (["fp16"] if fp16 else [])
    for name, base in (("digits/mlp", DIGITS), ("pycode/gpt", GPT)):
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        for _ in range(repeats):
            for v in variants:
                runs[v].append(train_run({**base, "precision": v}))
        ref = _median(runs["fp32"], "samples_per_second")
        print(f"\n{name} ({repeats} runs each, medians)")
        print("| precision | test accuracy | test loss | samples/s | samples/s / fp32 |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for v in variants:
            acc = runs[v][0]["final_accuracy"]
            acc_text = "-" if acc is None else f"{_median(runs[v], 'final_accuracy'):.4f}"
            sps = _median(runs[v], "samples_per_second")
            loss = _median(runs[v], "final_test_loss")
            print(f"| {v} | {acc_text} | {loss:.4f} | {sps:.0f} | {sps / ref:.2f} |")


def prefetch(delay_ms: float, repeats: int) -> None:
    from disttrain.launch.commands import train_run

    runs: dict[int, list[dict[str, Any]]] = {0: [], 2: []}
    for _ in range(repeats):
        for depth in runs:
            runs[depth].append(
                train_run({**DIGITS, "epochs": 3, "prefetch": depth, "loader_delay_ms": delay_ms})
            )
    print(f"\nloader delay {delay_ms} ms per batch, digits/mlp, 2 workers ({repeats} runs each)")
    print("| prefetch | data wait per step (ms) | compute+comm per step (ms) | samples/s |")
    print("| --- | ---: | ---: | ---: |")
    for depth, rs in runs.items():
        steps = rs[0]["steps"]
        wait = statistics.median(r["time_breakdown"].get("data", 0.0) for r in rs) / steps
        busy = (
            statistics.median(
                r["time_breakdown"]["compute"] + r["time_breakdown"]["communication"] for r in rs
            )
            / steps
        )
        sps = _median(rs, "samples_per_second")
        label = "on (2 batches)" if depth else "off"
        print(f"| {label} | {wait * 1e3:.1f} | {busy * 1e3:.1f} | {sps:.0f} |")


def algorithm(workers: list[int], repeats: int) -> None:
    """The default (auto) against native, in ``repeats`` alternating pairs per worker count."""
    from disttrain.launch.commands import train_run

    print("| workers | table (auto) | default / native, each pair | median |")
    print("| ---: | --- | --- | ---: |")
    for w in workers:
        base = {**DIGITS, "epochs": 2, "workers": w, "progress": False}
        ratios, table = [], ""
        for k in range(repeats):
            order = ("default", "native") if k % 2 == 0 else ("native", "default")
            sps: dict[str, float] = {}
            for v in order:
                flags = base if v == "default" else {**base, "algorithm": "native"}
                summary = train_run(flags)
                sps[v] = float(summary["samples_per_second"])
                if v == "default":
                    table = summary["config"].get("allreduce_table", "?")
            ratios.append(sps["default"] / sps["native"])
        shown = ", ".join(f"{r:.2f}" for r in ratios)
        print(f"| {w} | `{table}` | {shown} | **{statistics.median(ratios):.2f}** |")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="what", required=True, parser_class=type(parser))
    p = sub.add_parser("precision", help="fp32 vs bf16 (and fp16)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--fp16", action="store_true", help="also fp16 (emulated, very slow on CPU)")
    q = sub.add_parser("prefetch", help="a slow loader with prefetching off and on")
    q.add_argument("--delay-ms", type=float, default=20.0)
    q.add_argument("--repeats", type=int, default=1)
    a = sub.add_parser("algorithm", help="the default --algorithm (auto) vs native")
    a.add_argument("--workers", default="2,4", help="worker counts, comma-separated")
    a.add_argument("--repeats", type=int, default=3, help="pairs per worker count")


def run(args: argparse.Namespace) -> int:
    if args.what == "precision":
        precision(args.repeats, args.fp16)
    elif args.what == "algorithm":
        from disttrain.comm.errors import UsageError

        counts = [w.strip() for w in args.workers.split(",")]
        if not all(w.isdigit() and int(w) >= 2 for w in counts) or args.repeats < 1:
            raise UsageError(
                f"--workers {args.workers!r} --repeats {args.repeats}: write worker counts "
                "of at least 2 (2,4) and at least one pair"
            )
        algorithm([int(w) for w in counts], args.repeats)
    else:
        prefetch(args.delay_ms, args.repeats)
    return 0
