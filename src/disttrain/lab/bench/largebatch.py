"""Accuracy against the global batch, with and without linear LR scaling and warm-up."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from disttrain.comm.errors import UsageError
from disttrain.launch.commands import train_run

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batches", default="32,64,128,256,512,1024", help="global batches")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.05, help="the rate for --base-batch-size")
    parser.add_argument("--base-batch-size", type=int, default=32)
    parser.add_argument("--warmup-epochs", type=float, default=2.0)
    parser.add_argument(
        "--extra", default="", help="more train flags, e.g. '--pycode-chars 100000'"
    )
    parser.add_argument("--json", help="write the rows here")


def _batches(text: str, workers: int) -> list[int]:
    try:
        batches = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise UsageError(f"--batches {text!r}: use comma-separated integers") from None
    bad = [b for b in batches if b <= 0 or b % workers]
    if not batches or bad:
        raise UsageError(f"--batches: each must be a positive multiple of --workers {workers}")
    return batches


def _extra(text: str) -> dict[str, object]:
    words = text.split()
    if len(words) % 2:
        raise UsageError(f"--extra {text!r}: give flag-value pairs")
    return {
        w.lstrip("-").replace("-", "_"): v for w, v in zip(words[::2], words[1::2], strict=True)
    }


def run(args: argparse.Namespace) -> int:
    batches = _batches(args.batches, args.workers)
    variants = {
        "same lr": {},
        "linear scaling + warm-up": {
            "lr_scaling": "linear",
            "base_batch_size": args.base_batch_size,
            "warmup_epochs": args.warmup_epochs,
        },
    }
    rows = []
    with Progress(console=Console(stderr=True)) as progress:
        task = progress.add_task("large batch", total=len(batches) * len(variants))
        for batch in batches:
            for name, flags in variants.items():
                progress.update(task, description=f"batch {batch}, {name}")
                summary = train_run(
                    {
                        "dataset": args.dataset,
                        "model": args.model,
                        "epochs": args.epochs,
                        "workers": args.workers,
                        "batch_size": batch,
                        "lr": args.lr,
                        **flags,
                        **_extra(args.extra),
                    }
                )
                rows.append(
                    {
                        "global_batch": batch,
                        "variant": name,
                        "final_lr": summary["final_lr"],
                        "final_accuracy": summary["final_accuracy"],
                        "final_test_loss": summary["final_test_loss"],
                        "steps": summary["steps"],
                        "samples_per_second": summary["samples_per_second"],
                    }
                )
                progress.advance(task)
    title = f"{args.model} on {args.dataset}, {args.epochs} epochs"
    table = Table(title=f"{title}, lr {args.lr} at batch {args.base_batch_size}")
    for col in ("global batch", "variant", "steps", "final lr", "test accuracy", "test loss"):
        table.add_column(col, justify="right")
    for r in rows:
        acc = "-" if r["final_accuracy"] is None else f"{r['final_accuracy']:.4f}"
        table.add_row(
            str(r["global_batch"]),
            str(r["variant"]),
            str(r["steps"]),
            f"{r['final_lr']:.4g}",
            acc,
            f"{r['final_test_loss']:.4f}",
        )
    Console().print(table)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0
