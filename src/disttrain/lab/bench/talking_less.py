"""Talking less: dense allreduce vs local SGD vs compressed decentralized SGD, bytes and accuracy.

    disttrain bench talking-less --workload digits --repeats 1
    disttrain bench talking-less --workload pycode --repeats 1
    disttrain bench talking-less --workload pycode --pycode-chars 200000 \
        --only "localsgd H=16;decentralized onebit:0.03;..."

Each configuration runs ``disttrain train`` as a subprocess (4 workers, the
same seed, epochs and global batch), then reads its summary.json. Bytes are
per rank per step from the meter; the anchor is dense fp32 allreduce measured
in the same invocation, and every ratio is against it. With --repeats > 1 the
median of each figure is printed (the machine is shared: samples/s is noisy).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from disttrain.comm.errors import UsageError

__all__ = ["CONFIGS", "add_arguments", "run"]

#: label -> extra flags; the first one is the anchor.
SGD = ["--optimizer", "sgd", "--lr", "0.5"]  # = momentum 0.9 at lr 0.05, without the momentum
MOMENTUM = ["--optimizer", "momentum", "--lr", "0.05"]
#: Strom's "fewer nodes early": only rank 0 sends for the first epoch (22 steps on digits)
FEW_EARLY = ["--active-warmup-steps", "22", "--active-workers", "1"]
CONFIGS: dict[str, dict[str, list[str]]] = {
    "digits": {
        "allreduce fp32 (anchor)": ["--strategy", "allreduce"],
        "allreduce fp32, sgd lr 0.5": ["--strategy", "allreduce", *SGD],
        "localsgd H=16": ["--strategy", "localsgd", "--period", "16"],
        "localsgd H=16 +opt state": [
            "--strategy", "localsgd", "--period", "16", "--average-optimizer-state",
        ],
        "decentralized fp16": ["--strategy", "decentralized", "--compression", "fp16"],
        "decentralized topk:0.001": ["--strategy", "decentralized", "--compression", "topk:0.001"],
        "decentralized onebit:0.03": [
            "--strategy", "decentralized", "--compression", "onebit:0.03",
        ],
        "decentralized onebit:0.03, sgd lr 0.5": [
            "--strategy", "decentralized", "--compression", "onebit:0.03", *SGD,
        ],
        "decentralized ring onebit:0.015, sgd lr 0.5": [
            "--strategy", "decentralized", "--compression", "onebit:0.015", "--topology", "ring",
            *SGD,
        ],
        "decentralized onebit:0.03, sgd lr 0.5, 1 active for 22 steps": [
            "--strategy", "decentralized", "--compression", "onebit:0.03", *SGD, *FEW_EARLY,
        ],
        "decentralized onebit:0.03, 1 active for 22 steps": [
            "--strategy", "decentralized", "--compression", "onebit:0.03", *FEW_EARLY,
        ],
        "decentralized onebit:0.03, momentum-correction": [
            "--strategy", "decentralized", "--compression", "onebit:0.03", "--momentum-correction",
        ],
        # the velocity is ~1/(1-m) = 10x the gradient: 10x the threshold for similar bytes
        "decentralized onebit:0.3, momentum-correction": [
            "--strategy", "decentralized", "--compression", "onebit:0.3", "--momentum-correction",
        ],
    },
    "pycode": {
        "allreduce fp32, adam (anchor)": ["--strategy", "allreduce"],
        "localsgd H=16": ["--strategy", "localsgd", "--period", "16"],
        "localsgd H=16 +opt state": [
            "--strategy", "localsgd", "--period", "16", "--average-optimizer-state",
        ],
        "decentralized topk:0.01": ["--strategy", "decentralized", "--compression", "topk:0.01"],
        "decentralized onebit:0.03": [
            "--strategy", "decentralized", "--compression", "onebit:0.03",
        ],
        "allreduce fp32, sgd lr 0.5": ["--strategy", "allreduce", *SGD],
        "decentralized onebit:0.03, sgd lr 0.5": [
            "--strategy", "decentralized", "--compression", "onebit:0.03", *SGD,
        ],
        "decentralized onebit:0.03, sgd lr 0.5, 1 active for 22 steps": [
            "--strategy", "decentralized", "--compression", "onebit:0.03", *SGD, *FEW_EARLY,
        ],
        "allreduce fp32, momentum lr 0.05": ["--strategy", "allreduce", *MOMENTUM],
        "decentralized onebit:0.03, momentum lr 0.05": [
            "--strategy", "decentralized", "--compression", "onebit:0.03", *MOMENTUM,
        ],
        "decentralized onebit:0.03, momentum lr 0.05, momentum-correction": [
            "--strategy", "decentralized", "--compression", "onebit:0.03", *MOMENTUM,
            "--momentum-correction",
        ],
        "decentralized onebit:0.3, momentum lr 0.05, momentum-correction": [
            "--strategy", "decentralized", "--compression", "onebit:0.3", *MOMENTUM,
            "--momentum-correction",
        ],
    },
}  # fmt: skip

BASE = {
    "digits": ["--model", "mlp", "--dataset", "digits", "--epochs", "10"],
    "pycode": [
        "--model", "gpt", "--dataset", "pycode", "--pycode-chars", "60000", "--epochs", "2",
        "--optimizer", "adam", "--lr", "0.002", "--batch-size", "32",
    ],
}  # fmt: skip


def base_flags(workload: str, pycode_chars: int) -> list[str]:
    """The workload's flags, with --pycode-chars replaced for a longer pycode run."""
    flags = list(BASE[workload])
    if workload == "pycode":
        flags[flags.index("--pycode-chars") + 1] = str(pycode_chars)
    return flags


def run_one(flags: list[str], out: str, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "disttrain", "train", "--workers", "4", "--no-progress"]
    cmd += [*flags, "--out", out]
    subprocess.run(cmd, check=True, timeout=timeout, capture_output=True)
    with open(os.path.join(out, "summary.json")) as fh:
        return json.load(fh)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", choices=sorted(CONFIGS), default="digits")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--only", default="", help="';'-separated labels to run (anchor always)")
    parser.add_argument("--timeout", type=float, default=1200.0)
    parser.add_argument(
        "--pycode-chars", type=int, default=60000, help="pycode: more text, more steps per epoch"
    )


def run(args: argparse.Namespace) -> int:
    configs = CONFIGS[args.workload]
    labels = list(configs)
    if args.only:
        wanted = {w.strip() for w in args.only.split(";")}
        unknown = wanted - set(labels)
        if unknown:
            raise UsageError(f"--only: unknown labels {sorted(unknown)}; choose from {labels}")
        labels = [labels[0], *[lb for lb in labels[1:] if lb in wanted]]
    rows: dict[str, list[dict[str, Any]]] = {lb: [] for lb in labels}
    with tempfile.TemporaryDirectory(prefix="talking-less-") as tmp:
        for rep in range(args.repeats):
            for i, label in enumerate(labels):
                out = os.path.join(tmp, f"{rep}-{i}")
                flags = base_flags(args.workload, args.pycode_chars) + configs[label]
                s = run_one(flags, out, args.timeout)
                rows[label].append(s)
                print(f"# done {label} (repeat {rep + 1})", file=sys.stderr, flush=True)

    def med(label: str, key: str) -> float:
        vals = [r[key] for r in rows[label] if r.get(key) is not None]
        return statistics.median(vals) if vals else float("nan")

    def per_step(label: str) -> float:
        return statistics.median(r["bytes_sent_per_rank"] / r["steps"] for r in rows[label])

    anchor = labels[0]
    quality = "final_accuracy" if args.workload == "digits" else "final_test_loss"
    print(
        f"| strategy | bytes/step/rank | fewer bytes than anchor | {quality} "
        "| samples/s | samples/s vs anchor | payload compression | bits/sent entry (entropy) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label in labels:
        bps = per_step(label)
        ratio = per_step(anchor) / bps if bps else float("inf")
        sps = med(label, "samples_per_second")
        bits = med(label, "bits_per_sent_entry")
        ent = med(label, "entropy_bits_per_sent_entry")
        bits_cell = f"{bits:.2f} ({ent:.2f})" if bits == bits else "-"
        cr = med(label, "payload_compression")
        print(
            f"| {label} | {bps:,.0f} | {ratio:,.1f}x | {med(label, quality):.4f} | {sps:.0f} "
            f"| {sps / med(anchor, 'samples_per_second'):.2f} "
            f"| {'-' if cr != cr else f'{cr:,.0f}'} | {bits_cell} |"
        )
    print(f"\n(median of {args.repeats} run(s) each; 4 workers on a shared 2-core machine)")
    return 0
