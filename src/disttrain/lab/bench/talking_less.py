"""Talking less: dense allreduce vs local SGD, PowerSGD, decentralized SGD: bytes and quality.

    disttrain bench talking-less --workload digits --repeats 1
    disttrain bench talking-less --workload pycode --repeats 1
    disttrain bench talking-less --workload pycode --pycode-chars 200000 \
        --only "localsgd H=16;decentralized onebit:0.03;..."
    disttrain bench talking-less --workload diloco --plot benchmarks/results/diloco_curves.png
    disttrain bench talking-less --workload pycode --pycode-chars 1000000 \
        --only "allreduce powersgd:2;allreduce powersgd:4"

Each configuration runs ``disttrain train`` as a subprocess (4 workers, the
same seed, epochs and global batch), then reads its summary.json. Bytes are
per rank per step from the meter; the anchor is dense fp32 allreduce measured
in the same invocation, and every ratio is against it. With --repeats > 1 the
median of each figure is printed (the machine is shared: samples/s is noisy).

The ``diloco`` workload is the issue's DiLoCo comparison: the default gpt
(0.87M parameters) on 2M characters of pycode, the same 1,600 steps of global
batch 32 for every row (8 outer steps at H = 200), Adam at 0.002 with a
0.1-epoch warm-up and cosine decay, chosen once for every row; DiLoCo at its default
outer step (lr 1.0, Nesterov 0.3 since bdda2dd/d7b0ac1, which also run localsgd's and
DiLoCo's Adam steps at lr x sqrt(N); RESULTS rows of earlier commits ran the paper's
0.7 / 0.9, unscaled: their labels say "outer 0.7/0.9"), and at H = 50 at each outer step of
``OUTER_GRID``; the one with the lowest validation loss (``CHOSEN_OUTER``) also at
H = 200 and streamed, streaming also at each of its own ``STREAM_MIXES``. On pycode
every row's final model is also scored on the two halves of the held-out windows: the
first (validation) is what settings are chosen on, the second (test) what a chosen row
reports. ``--plot`` draws rank 0's training loss (a 50-step moving mean) of every row
against the samples seen.
"""

from __future__ import annotations

import argparse
import os
import statistics
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
#: PowerSGD at rank 2 and 4 on the allreduce strategy, from step 0 (no dense warm-up)
POWERSGD = {
    f"allreduce powersgd:{r}": ["--strategy", "allreduce", "--compression", f"powersgd:{r}"]
    for r in (2, 4)
}
#: DiLoCo's outer step (lr, Nesterov momentum) tried at H = 50 besides the paper's (0.7, 0.9),
#: compared on the validation half of the held-out windows (the test half is reported)
OUTER_GRID = (
    (0.2, 0.9),
    (0.35, 0.9),
    (1.0, 0.9),
    (1.4, 0.9),
    (0.7, 0.5),
    (0.8, 0.5),
    (1.0, 0.3),
    (1.0, 0.5),
    (1.0, 0.7),
    (1.2, 0.5),
)
#: the grid's choice (lowest validation loss at H = 50), run at H = 200 and streamed too
CHOSEN_OUTER = (1.0, 0.5)
#: streaming's own setting, tried at H = 50 with the chosen outer step: the weight of the
#: local weights when a fragment's update lands (0.5, the default, besides these)
STREAM_MIXES = (0.0, 0.25)


def _outer(
    h: int, lr: float, momentum: float, fragments: int = 1, mix: float | None = None
) -> tuple[str, list[str]]:
    """A DiLoCo row with its own outer step (and streaming's mix): (label, flags)."""
    kind = f"streaming diloco H={h} F={fragments}" if fragments > 1 else f"diloco H={h}"
    flags = [
        "--strategy",
        "diloco",
        "--period",
        str(h),
        "--outer-lr",
        str(lr),
        "--outer-momentum",
        str(momentum),
        "--fragments",
        str(fragments),
    ]
    if mix is None:
        return f"{kind} outer {lr:g}/{momentum:g}", flags
    return f"{kind} outer {lr:g}/{momentum:g} mix {mix:g}", [*flags, "--fragment-mix", str(mix)]


CONFIGS: dict[str, dict[str, list[str]]] = {
    "digits": {
        "allreduce fp32 (anchor)": ["--strategy", "allreduce"],
        "allreduce fp32, sgd lr 0.5": ["--strategy", "allreduce", *SGD],
        "localsgd H=16": ["--strategy", "localsgd", "--period", "16"],
        "localsgd H=16 +opt state": [
            "--strategy",
            "localsgd",
            "--period",
            "16",
            "--average-optimizer-state",
        ],
        "decentralized fp16": ["--strategy", "decentralized", "--compression", "fp16"],
        "decentralized topk:0.001": ["--strategy", "decentralized", "--compression", "topk:0.001"],
        "decentralized onebit:0.03": [
            "--strategy",
            "decentralized",
            "--compression",
            "onebit:0.03",
        ],
        "decentralized onebit:0.03, sgd lr 0.5": [
            "--strategy",
            "decentralized",
            "--compression",
            "onebit:0.03",
            *SGD,
        ],
        "decentralized ring onebit:0.015, sgd lr 0.5": [
            "--strategy",
            "decentralized",
            "--compression",
            "onebit:0.015",
            "--topology",
            "ring",
            *SGD,
        ],
        "decentralized onebit:0.03, sgd lr 0.5, 1 active for 22 steps": [
            "--strategy",
            "decentralized",
            "--compression",
            "onebit:0.03",
            *SGD,
            *FEW_EARLY,
        ],
        "decentralized onebit:0.03, 1 active for 22 steps": [
            "--strategy",
            "decentralized",
            "--compression",
            "onebit:0.03",
            *FEW_EARLY,
        ],
        "decentralized onebit:0.03, momentum-correction": [
            "--strategy",
            "decentralized",
            "--compression",
            "onebit:0.03",
            "--momentum-correction",
        ],
        # the velocity is ~1/(1-m) = 10x the gradient: 10x the threshold for similar bytes
        "decentralized onebit:0.3, momentum-correction": [
            "--strategy",
            "decentralized",
            "--compression",
            "onebit:0.3",
            "--momentum-correction",
        ],
        **POWERSGD,
    },
    "pycode": {
        "allreduce fp32, adam (anchor)": ["--strategy", "allreduce"],
        "localsgd H=16": ["--strategy", "localsgd", "--period", "16"],
        "localsgd H=16 +opt state": [
            "--strategy",
            "localsgd",
            "--period",
            "16",
            "--average-optimizer-state",
        ],
        "decentralized topk:0.01": ["--strategy", "decentralized", "--compression", "topk:0.01"],
        "decentralized onebit:0.03": [
            "--strategy",
            "decentralized",
            "--compression",
            "onebit:0.03",
        ],
        "allreduce fp32, sgd lr 0.5": ["--strategy", "allreduce", *SGD],
        "decentralized onebit:0.03, sgd lr 0.5": [
            "--strategy",
            "decentralized",
            "--compression",
            "onebit:0.03",
            *SGD,
        ],
        "decentralized onebit:0.03, sgd lr 0.5, 1 active for 22 steps": [
            "--strategy",
            "decentralized",
            "--compression",
            "onebit:0.03",
            *SGD,
            *FEW_EARLY,
        ],
        "allreduce fp32, momentum lr 0.05": ["--strategy", "allreduce", *MOMENTUM],
        "decentralized onebit:0.03, momentum lr 0.05": [
            "--strategy",
            "decentralized",
            "--compression",
            "onebit:0.03",
            *MOMENTUM,
        ],
        "decentralized onebit:0.03, momentum lr 0.05, momentum-correction": [
            "--strategy",
            "decentralized",
            "--compression",
            "onebit:0.03",
            *MOMENTUM,
            "--momentum-correction",
        ],
        "decentralized onebit:0.3, momentum lr 0.05, momentum-correction": [
            "--strategy",
            "decentralized",
            "--compression",
            "onebit:0.3",
            *MOMENTUM,
            "--momentum-correction",
        ],
        **POWERSGD,
        # compare with "allreduce fp32, momentum lr 0.05": with Adam, PowerSGD lags dense
        **{f"{label}, momentum lr 0.05": [*flags, *MOMENTUM] for label, flags in POWERSGD.items()},
    },
    "diloco": {
        "allreduce, adam (anchor)": ["--strategy", "allreduce"],
        **{
            label: flags
            for h in ("50", "200")
            for label, flags in (
                (f"localsgd H={h}", ["--strategy", "localsgd", "--period", h]),
                (f"diloco H={h}", ["--strategy", "diloco", "--period", h]),
                (
                    f"streaming diloco H={h} F=4",
                    ["--strategy", "diloco", "--period", h, "--fragments", "4"],
                ),
            )
        },
        **dict(_outer(50, lr, m) for lr, m in OUTER_GRID),
        **dict(_outer(h, *CHOSEN_OUTER, fragments=f) for h, f in ((200, 1), (50, 4), (200, 4))),
        **dict(
            _outer(h, *CHOSEN_OUTER, fragments=4, mix=a) for h in (50, 200) for a in STREAM_MIXES
        ),
    },
}

BASE = {
    "digits": ["--model", "mlp", "--dataset", "digits", "--epochs", "10"],
    "pycode": [
        "--model",
        "gpt",
        "--dataset",
        "pycode",
        "--pycode-chars",
        "60000",
        "--epochs",
        "2",
        "--optimizer",
        "adam",
        "--lr",
        "0.002",
        "--batch-size",
        "32",
    ],
    "diloco": [
        "--model",
        "gpt",
        "--dataset",
        "pycode",
        "--pycode-chars",
        "2000000",
        "--epochs",
        "2",
        "--max-steps",
        "1600",
        "--optimizer",
        "adam",
        "--lr",
        "0.002",
        "--lr-schedule",
        "cosine",
        "--warmup-epochs",
        "0.1",
        "--batch-size",
        "32",
        "--log-every",
        "10",
    ],
}


def base_flags(workload: str, pycode_chars: int | None) -> list[str]:
    """The workload's flags, with --pycode-chars replaced for a longer pycode run."""
    flags = list(BASE[workload])
    if pycode_chars is not None and "--pycode-chars" in flags:
        flags[flags.index("--pycode-chars") + 1] = str(pycode_chars)
    return flags


def run_one(flags: list[str], out: str, timeout: float) -> dict[str, Any]:
    """One run's summary, with rank 0's (step, training loss) curve under ``"curve"``."""
    from disttrain.launch.commands import train_argv

    summary = train_argv(["--workers", "4", *flags], out, timeout)
    summary["curve"] = [(m["step"], m["loss"]) for m in summary["metrics"] if "loss" in m]
    if summary["config"]["dataset"] == "pycode":
        summary["validation_loss"], summary["test_half_loss"] = held_out_halves(out, summary)
    return summary


def held_out_halves(out: str, summary: dict[str, Any]) -> tuple[float, float]:
    """The run's final model (``out``/model.pt) on the first half of the held-out windows
    (validation: what a row's settings are chosen on) and on the second (test: what is
    reported for the chosen row; ``final_test_loss`` is the mean of the two)."""
    import dataclasses

    import torch

    from disttrain.config import DataConfig
    from disttrain.data import load_dataset
    from disttrain.models import build_model
    from disttrain.train.trainer import evaluate

    cfg = summary["config"]
    data = load_dataset(
        DataConfig(dataset="pycode", pycode_chars=cfg["pycode_chars"], seq_len=cfg["seq_len"])
    )
    model = build_model(cfg["model"], data)
    model.load_state_dict(torch.load(os.path.join(out, "model.pt"), weights_only=True))
    half = len(data.x_test) // 2
    losses = []
    for part in (slice(None, half), slice(half, None)):
        windows = dataclasses.replace(data, x_test=data.x_test[part], y_test=data.y_test[part])
        losses.append(evaluate(model, windows, torch.device("cpu"))[0])
    return losses[0], losses[1]


def plot_curves(path: str, rows: dict[str, list[dict[str, Any]]], quality: str) -> None:
    """Rank 0's training loss of each row's first run (50-step moving mean) vs samples seen."""
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for label, runs in rows.items():
        curve, batch = runs[0]["curve"], runs[0]["global_batch_size"]
        if not curve:
            continue
        steps, losses = zip(*curve, strict=True)
        every = max(1, steps[1] - steps[0]) if len(steps) > 1 else 1
        k = max(1, 50 // every)  # a window of ~50 steps: rank 0's batch loss is noisy
        smooth = [
            sum(losses[max(0, i - k + 1) : i + 1]) / len(losses[max(0, i - k + 1) : i + 1])
            for i in range(len(losses))
        ]
        final = runs[0].get(quality)
        ax.plot([s * batch for s in steps], smooth, label=f"{label} (test {final:.4f})")
    ax.set_xlabel("samples seen (global)")
    ax.set_ylabel("training loss, rank 0 (50-step mean)")
    ax.set_ylim(top=min(ax.get_ylim()[1], 3.5))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", choices=sorted(CONFIGS), default="digits")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--only", default="", help="';'-separated labels to run (anchor always)")
    parser.add_argument("--timeout", type=float, default=1200.0)
    parser.add_argument(
        "--pycode-chars",
        type=int,
        default=None,
        help="more text, more steps per epoch (default: the workload's own)",
    )
    parser.add_argument("--plot", default="", help="write the loss curves to this .png")
    parser.add_argument("--keep", default="", help="keep each run's --out under this folder")
    parser.add_argument(
        "--lr", type=float, default=None, help="every row's --lr (default: the workload's)"
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="diloco workload: every row's steps (default 1600; the epochs stop being a limit)",
    )


def run(args: argparse.Namespace) -> int:
    labels = _labels(args)
    rows = _run_rows(args, labels)
    quality = "final_accuracy" if args.workload == "digits" else "final_test_loss"
    _print_table(rows, labels, quality)
    print(f"\n(median of {args.repeats} run(s) each; 4 workers on a shared 2-core machine)")
    if args.plot:
        plot_curves(args.plot, rows, quality)
        print(f"curves: {args.plot}")
    return 0


def _labels(args: argparse.Namespace) -> list[str]:
    """The rows to run: the workload's configs, or the anchor and those ``--only`` names.

    Also refuses ``--max-steps`` for a workload that ends on its epochs.
    """
    labels = list(CONFIGS[args.workload])
    steps_end_it = "--max-steps" in BASE[args.workload]  # the others end on their epochs
    if args.max_steps is not None and (not steps_end_it or args.max_steps < 1):
        ended = [w for w, flags in BASE.items() if "--max-steps" in flags]
        raise UsageError(
            f"--max-steps: a positive number of steps, for a workload that ends "
            f"on steps ({', '.join(ended)})"
        )
    if args.only:
        wanted = {w.strip() for w in args.only.split(";")}
        unknown = wanted - set(labels)
        if unknown:
            raise UsageError(f"--only: unknown labels {sorted(unknown)}; choose from {labels}")
        labels = [labels[0], *[lb for lb in labels[1:] if lb in wanted]]
    return labels


def _run_rows(args: argparse.Namespace, labels: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Train every label ``--repeats`` times, labels interleaved within each repeat.

    Returns each label's summaries; a line per run goes to stderr as it ends.
    """
    configs = CONFIGS[args.workload]
    rows: dict[str, list[dict[str, Any]]] = {lb: [] for lb in labels}
    with tempfile.TemporaryDirectory(prefix="talking-less-") as scratch:
        tmp = args.keep or scratch
        for rep in range(args.repeats):
            for i, label in enumerate(labels):
                out = os.path.join(tmp, f"{rep}-{i}")
                flags = base_flags(args.workload, args.pycode_chars) + configs[label]
                if args.lr is not None:  # the last --lr given wins: one value for every row
                    flags += ["--lr", str(args.lr)]
                if args.max_steps is not None:  # the steps, not the 2 epochs, end each row
                    flags += ["--max-steps", str(args.max_steps), "--epochs", "1000"]
                s = run_one(flags, out, args.timeout)
                rows[label].append(s)
                print(
                    f"# done {label} (repeat {rep + 1}): test loss {s['final_test_loss']:.4f}, "
                    f"{s['bytes_sent_per_rank']:,} bytes/rank, peak/step "
                    f"{s.get('peak_bytes_per_step', '-')}, {s['wall_seconds']:.0f} s, "
                    f"load {os.getloadavg()[0]:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
    return rows


def _print_table(rows: dict[str, list[dict[str, Any]]], labels: list[str], quality: str) -> None:
    """The markdown table: per label the medians over its runs, and each against the anchor
    (the first label): fewer bytes per step, quality change in %, throughput ratio."""

    def med(label: str, key: str) -> float:
        vals = [r[key] for r in rows[label] if r.get(key) is not None]
        return statistics.median(vals) if vals else float("nan")

    def per_step(label: str) -> float:
        return statistics.median(r["bytes_sent_per_rank"] / r["steps"] for r in rows[label])

    anchor = labels[0]
    halves = any("validation_loss" in r for runs in rows.values() for r in runs)  # pycode's
    print(
        f"| strategy | bytes/step/rank | fewer bytes than anchor | {quality} | vs anchor "
        + ("| validation loss (1st half) | test loss (2nd half) " if halves else "")
        + "| samples/s | samples/s vs anchor | payload compression | bits/sent entry (entropy) "
        "| peak bytes in one step |"
    )
    print(
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        + (" ---: | ---: |" if halves else "")
    )
    for label in labels:
        bps = per_step(label)
        ratio = per_step(anchor) / bps if bps else float("inf")
        sps = med(label, "samples_per_second")
        bits = med(label, "bits_per_sent_entry")
        ent = med(label, "entropy_bits_per_sent_entry")
        bits_cell = f"{bits:.2f} ({ent:.2f})" if bits == bits else "-"
        cr = med(label, "payload_compression")
        peak = med(label, "peak_bytes_per_step")  # streaming's figure (diloco)
        vs = 100 * (med(label, quality) / med(anchor, quality) - 1)
        split = (
            f"| {med(label, 'validation_loss'):.4f} | {med(label, 'test_half_loss'):.4f} "
            if halves
            else ""
        )
        print(
            f"| {label} | {bps:,.0f} | {ratio:,.1f}x | {med(label, quality):.4f} | {vs:+.2f} % "
            f"{split}| {sps:.0f} | {sps / med(anchor, 'samples_per_second'):.2f} "
            f"| {'-' if cr != cr else f'{cr:,.0f}'} | {bits_cell} "
            f"| {'-' if peak != peak else f'{peak:,.0f}'} |"
        )
