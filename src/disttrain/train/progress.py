"""Rank 0's live progress bar (epoch, step, loss, samples/s) and the closing summary table."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from disttrain.units import human_bytes

__all__ = ["ProgressBar", "print_summary", "title"]


class ProgressBar:
    """A rich progress bar over all steps of the run; silent when disabled."""

    def __init__(self, total_steps: int, enabled: bool, epochs: int = 0) -> None:
        self._progress: Progress | None = None
        self._steps, self._epochs = total_steps, epochs
        if not enabled:
            return
        # epochs count from 1, as the summary table's ``epochs`` does: "epoch 10/10" at the end
        self._progress = Progress(
            TextColumn("epoch {task.fields[epoch]}/{task.fields[epochs]}"),
            BarColumn(),
            TextColumn("step {task.completed}/{task.total}"),
            TextColumn("loss {task.fields[loss]:.4f}"),
            TextColumn("{task.fields[sps]:,.0f} samples/s"),
            TimeElapsedColumn(),
            console=Console(file=sys.stderr),
            transient=False,
        )
        self._task = self._progress.add_task(
            "train", total=total_steps, epoch=1, epochs=epochs, loss=0.0, sps=0.0
        )
        self._progress.start()

    def update(self, step: int, epoch: int, loss: float, samples_per_second: float) -> None:
        """``epoch`` counts from 0 (the loop's index); the bar shows it from 1. An
        asynchronous worker's own count may pass the job's (it may do more than its share of
        the budget): the bar stops at the job's totals."""
        if self._progress is not None:
            shown = min(epoch + 1, self._epochs) if self._epochs else epoch + 1
            self._progress.update(
                self._task,
                completed=min(step, self._steps),
                epoch=shown,
                loss=loss,
                sps=samples_per_second,
            )

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):  # losses to 4 places; rates and times to 0.1 (969.6, 7,002.3)
        return f"{value:,.4f}" if abs(value) < 100 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def title(summary: dict[str, Any]) -> str:
    """``disttrain ps · 2 workers + 1 server``: processes that serve are not workers."""
    servers = int(summary.get("servers") or 0)
    who = _plural(int(summary["world_size"]) - servers, "worker")
    if servers:
        who += " + " + _plural(servers, "server")
    return f"disttrain {summary['strategy']} · {who}"


def print_summary(summary: dict[str, Any], out_dir: str) -> None:
    """Print the run's key figures as a table."""
    table = Table(title=title(summary))
    table.add_column("metric")
    table.add_column("value", justify="right")
    keys = (
        "model",
        "dataset",
        "epochs",
        "steps",
        "global_batch_size",
        "final_test_loss",
        "final_train_loss",
        "final_accuracy",
        "wall_seconds",
        "samples_per_second",
        "bytes_sent_per_rank",
        "bytes_copied_per_rank",
    )
    for key in keys:
        value = summary.get(key)
        shown = human_bytes(value) if key.startswith("bytes") and value is not None else _fmt(value)
        table.add_row(key, shown)
    for phase, seconds in summary["time_breakdown"].items():
        table.add_row(f"time: {phase} (s)", _fmt(seconds))
    # --algorithm auto: wherever the strategy's summary put it (collectives.by_size)
    places = (summary, *(v for v in summary.values() if isinstance(v, dict)))
    chosen = next((p["allreduce_by_size"] for p in places if p.get("allreduce_by_size")), None)
    if chosen:  # --algorithm auto: what ran each bucket size
        shown = ", ".join(f"{human_bytes(int(size))} {name}" for size, name in chosen.items())
        table.add_row("allreduce by size", shown)
    table.add_row("outputs", out_dir)
    Console().print(table)
