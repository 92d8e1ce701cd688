"""The ``compare`` report's PNG plots (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from disttrain.lab.runs import RunResult

__all__ = ["PHASES", "PLOTS", "draw_plots"]

#: file name -> caption, in report order
PLOTS: dict[str, str] = {
    "loss_vs_epoch.png": "test loss vs epoch",
    "loss_vs_time.png": "test loss vs wall time",
    "accuracy_vs_time.png": "test accuracy vs wall time (dashed: the target)",
    "accuracy_vs_bytes.png": "test accuracy vs bytes sent by rank 0 (log scale)",
    "throughput.png": "throughput (samples/s)",
    "train_loss_vs_step.png": "training loss per step (rank 0's batch, metrics.jsonl)",
    "time_breakdown.png": "where rank 0's time went (summary.json time_breakdown, seconds)",
    "memory.png": "memory of the fullest worker (MB) and peak RSS",
}

#: memory_per_rank's counted parts, stacked in the memory plot's order
MEMORY_PARTS = ("parameters", "gradients", "optimizer_state", "gathered_peak")

#: time_breakdown phases in the chart's order (others follow, alphabetically)
PHASES = ("compute", "communication", "wait", "data", "codec", "eval", "checkpoint")


def _series(run: RunResult, x: str, y: str) -> tuple[list[float], list[float]]:
    points = [
        (m[x], m[y]) for m in run.evaluations if m.get(x) is not None and m.get(y) is not None
    ]
    return [float(p[0]) for p in points], [float(p[1]) for p in points]


def draw_plots(out_dir: str, runs: list[RunResult], target: float) -> dict[str, str]:
    """Draw every plot of :data:`PLOTS` into ``out_dir``; name -> path of those drawn."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    done = [r for r in runs if r.summary is not None]
    paths: dict[str, str] = {}

    def save(fig: Any, ax: Any, name: str, xlabel: str, ylabel: str) -> None:
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(PLOTS[name])
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
        fig.tight_layout()
        paths[name] = os.path.join(out_dir, name)
        fig.savefig(paths[name], dpi=100)
        plt.close(fig)

    _curves(plt, done, target, save)
    _throughput(plt, done, save)
    _train_loss(plt, done, save)
    _breakdown(plt, done, save)
    _memory(plt, done, save)
    return paths


def _curves(plt: Any, done: list[RunResult], target: float, save: Any) -> None:
    """Test loss and accuracy against epochs, wall time and bytes, one line per run.

    Epochs count from 1 (the metrics' count from 0); bytes on a log scale, where
    only positive counts are plotted; the accuracy plot marks ``target``.
    """
    curves = (
        ("loss_vs_epoch.png", "epoch", "test_loss", "epoch", "test loss"),
        ("loss_vs_time.png", "wall_seconds", "test_loss", "wall time (s)", "test loss"),
        ("accuracy_vs_time.png", "wall_seconds", "test_accuracy", "wall time (s)", "accuracy"),
        ("accuracy_vs_bytes.png", "bytes_sent", "test_accuracy", "bytes sent", "test accuracy"),
    )
    for name, x, y, xlabel, ylabel in curves:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for run in done:
            xs, ys = _series(run, x, y)
            if x == "epoch":
                xs = [
                    v + 1 for v in xs
                ]  # metrics count epochs from 0; "after epoch 1" reads better
            if x == "bytes_sent":
                xs, ys = [a for a in xs if a > 0], [b for a, b in zip(xs, ys, strict=True) if a > 0]
            if xs:
                ax.plot(xs, ys, marker="o", label=run.label)
        if x == "epoch":
            from matplotlib.ticker import MaxNLocator

            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if x == "bytes_sent" and ax.lines:
            ax.set_xscale("log")
        if name == "accuracy_vs_time.png":
            ax.axhline(target, color="grey", linestyle="--", linewidth=1)
        save(fig, ax, name, xlabel, ylabel)


def _throughput(plt: Any, done: list[RunResult], save: Any) -> None:
    """One bar per run: its samples per second (0 where the summary has none)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    labels = [r.label for r in done]
    values = [float((r.summary or {}).get("samples_per_second") or 0.0) for r in done]
    bars = ax.bar(range(len(values)), values, color="tab:blue")
    ax.bar_label(bars, fmt="%.0f", fontsize="small")
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize="small")
    save(fig, ax, "throughput.png", "", "samples/s")


def _train_loss(plt: Any, done: list[RunResult], save: Any) -> None:
    """Each run's training loss at every logged step (rank 0's batch), not one point an epoch."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for run in done:  # every logged step, not one point per epoch
        steps = [m for m in (run.summary or {}).get("metrics", []) if "loss" in m]
        if steps:
            ax.plot(
                [m["step"] for m in steps], [m["loss"] for m in steps], label=run.label, linewidth=1
            )
    save(fig, ax, "train_loss_vs_step.png", "step", "training loss")


def _memory(plt: Any, done: list[RunResult], save: Any) -> None:
    """Left: one stacked bar per run, the parts of its fullest worker (the rank whose
    parameters + gradients + optimizer state + gathered peak are largest); right: the
    largest peak RSS of its processes (interpreter and libraries included)."""
    fig, (ax, rss) = plt.subplots(1, 2, figsize=(8.4, 4.2), width_ratios=(3, 2))
    memories = [(r.summary or {}).get("memory_per_rank") or {} for r in done]
    fullest = []
    for memory in memories:
        ranks = len(memory.get("parameters") or [])
        totals = [
            sum((memory.get(k) or [0] * ranks)[i] for k in MEMORY_PARTS) for i in range(ranks)
        ]
        fullest.append(max(range(ranks), key=totals.__getitem__) if ranks else None)
    bottom = [0.0] * len(done)
    for part in MEMORY_PARTS:
        heights = [
            (m.get(part) or [])[i] / 1e6 if i is not None and m.get(part) else 0.0
            for m, i in zip(memories, fullest, strict=True)
        ]
        if any(heights):
            ax.bar(range(len(done)), heights, bottom=bottom, label=part.replace("_", " "))
            bottom = [a + b for a, b in zip(bottom, heights, strict=True)]
    labels = [r.label for r in done]
    ax.set_xticks(range(len(done)), labels, rotation=20, ha="right", fontsize="small")
    peaks = [max(m.get("peak_rss") or [0]) / 1e6 for m in memories]
    bars = rss.bar(range(len(done)), peaks, color="tab:grey")
    rss.bar_label(bars, fmt="%.0f", fontsize="small")
    rss.set_xticks(range(len(done)), labels, rotation=20, ha="right", fontsize="small")
    rss.set_ylabel("peak RSS (MB)")
    rss.grid(True, alpha=0.3)
    save(fig, ax, "memory.png", "", "MB")


def _breakdown(plt: Any, done: list[RunResult], save: Any) -> None:
    """One stacked bar per run: compute, communication, wait, data, ... seconds."""
    parts = [dict((r.summary or {}).get("time_breakdown") or {}) for r in done]
    seen = {k for p in parts for k in p}
    order = [k for k in PHASES if k in seen] + sorted(seen - set(PHASES))
    fig, ax = plt.subplots(figsize=(6.4, max(3.2, 1.6 + 0.5 * len(done))))
    left = [0.0] * len(done)
    for phase in order:
        widths = [float(p.get(phase) or 0.0) for p in parts]
        ax.barh(range(len(done)), widths, left=left, label=phase)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_yticks(range(len(done)), [r.label for r in done], fontsize="small")
    ax.invert_yaxis()  # the first run (the anchor) on top
    ax.set_xlim(0, max(left, default=0.0) * 1.4 or 1.0)  # room on the right for the legend
    save(fig, ax, "time_breakdown.png", "seconds", "")
