"""What a run tells the tools people read: TensorBoard, and engines such as Ray Train.

A :class:`Tracker` is told, in order: ``scalars`` at every logged step and at each
epoch's end (rank 0 only: the ``metrics.jsonl`` record, flattened to numbers),
``checkpoint`` once a checkpoint step is committed (every rank, in step, so an
engine whose report is collective sees every rank call it), and ``finish`` with
the run's summary (every rank; rank 0's is the whole job's). Every method is a
no-op by default, so a tracker implements only what it needs.

:class:`TensorBoardTracker` writes TensorBoard event files with the ``tensorboard``
package's writer (``torch.utils.tensorboard.SummaryWriter``): every number of the
step record under ``train/`` (loss, lr, samples/s, bytes sent, compression figures,
staleness, ...), the test loss and accuracy under ``test/``, and the summary's
numbers under ``summary/`` (the pipeline's bubble, the parameter server's
staleness, peak memory per rank as ``summary/memory_per_rank/peak_rss/R``, ...).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["TensorBoardTracker", "Tracker", "flatten_numbers", "trackers_for"]


def flatten_numbers(values: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """Every finite number in ``values`` (nested dicts and lists included) as (path, value)."""
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool):
            yield name, float(value)
        elif isinstance(value, (int, float)):
            if math.isfinite(value):
                yield name, float(value)
        elif isinstance(value, Mapping):
            yield from flatten_numbers(value, name + "/")
        elif isinstance(value, (list, tuple)) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
        ):
            # a list ("bytes_sent_by_rank": one number per rank): one scalar per index
            yield from flatten_numbers({str(i): v for i, v in enumerate(value)}, name + "/")


class Tracker:
    """The interface: each hook is a no-op unless a tracker overrides it."""

    def scalars(self, step: int, values: Mapping[str, Any]) -> None:
        """Rank 0: a metrics record (numbers, possibly nested) at ``step``."""

    def checkpoint(self, step: int, folder: str) -> None:
        """Every rank: the checkpoint of ``step`` is committed in ``folder``."""

    def finish(self, summary: Mapping[str, Any], is_main: bool) -> None:
        """Every rank: the run ended; ``summary`` is this rank's (rank 0's is the job's)."""

    def close(self) -> None:
        """Release files and connections (also after a failure)."""


class TensorBoardTracker(Tracker):
    """Scalars into TensorBoard event files under ``folder`` (one run per folder)."""

    #: metrics record keys that are not measurements
    SKIP = frozenset({"step", "epoch"})

    def __init__(self, folder: str) -> None:
        # torch's writer is tensorboard's event-file writer with torch's tensors understood
        from torch.utils.tensorboard import SummaryWriter

        os.makedirs(folder, exist_ok=True)
        self.writer = SummaryWriter(log_dir=folder)

    def scalars(self, step: int, values: Mapping[str, Any]) -> None:
        if "test_loss" in values:  # an epoch's end: the test figures (the rest repeats)
            for name, value in flatten_numbers(values):
                if name.startswith("test_"):
                    self.writer.add_scalar(f"test/{name.removeprefix('test_')}", value, step)
            return
        for name, value in flatten_numbers({k: v for k, v in values.items() if k not in self.SKIP}):
            self.writer.add_scalar(f"train/{name}", value, step)

    def finish(self, summary: Mapping[str, Any], is_main: bool) -> None:
        if not is_main:
            return
        step = int(summary.get("steps", 0))
        skip = {"config", "time_breakdown"}
        for name, value in flatten_numbers({k: v for k, v in summary.items() if k not in skip}):
            self.writer.add_scalar(f"summary/{name}", value, step)
        for phase, seconds in summary.get("time_breakdown", {}).items():
            self.writer.add_scalar(f"time/{phase}_seconds", float(seconds), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def trackers_for(tc: Any, is_main: bool) -> list[Tracker]:
    """The trackers this process's settings ask for (TensorBoard on rank 0 only)."""
    out: list[Tracker] = []
    if tc.tensorboard and is_main:
        out.append(TensorBoardTracker(tc.tensorboard))
    return out
