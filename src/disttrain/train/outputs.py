"""What a run writes and shows: metrics.jsonl, the trackers, the progress bar, and at the
end summary.json and model.pt. The main worker (rank 0, or the survivor that took its
place) writes; every worker keeps its own last step line (live shrink hands it over)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from disttrain import checkpoint
from disttrain.train.metrics import MetricsWriter, write_summary
from disttrain.train.progress import ProgressBar
from disttrain.train.trackers import Tracker, trackers_for

__all__ = ["Outputs"]


class Outputs:
    """A run's outputs in ``tc.out``; ``main``: this process writes them."""

    def __init__(
        self,
        tc: Any,
        main: bool,
        append: bool,
        trackers: Sequence[Tracker],
        total_steps: int,
        epochs_shown: int,
    ) -> None:
        self.out, self.main = tc.out, main
        if main and self.out:
            os.makedirs(self.out, exist_ok=True)
        self.metrics = MetricsWriter(self._metrics_path(), append=append)
        self.tracking = [*trackers_for(tc, main), *trackers]
        self.bar = ProgressBar(total_steps, enabled=main and tc.progress, epochs=epochs_shown)
        self.logged: dict[str, Any] | None = None  # this worker's last step line

    def _metrics_path(self) -> str | None:
        return os.path.join(self.out, "metrics.jsonl") if self.main and self.out else None

    def line(self, step: int, record: dict[str, Any]) -> None:
        """A step's or an epoch's line: metrics.jsonl and the trackers (main only)."""
        if self.main:
            self.metrics.write(**record)
            for tracker in self.tracking:
                tracker.scalars(step, record)

    def step_line(self, step: int, record: dict[str, Any]) -> None:
        """A step's line, also kept by every worker (:attr:`logged`)."""
        self.logged = record
        self.line(step, record)

    def checkpointed(self, step: int) -> None:
        for tracker in self.tracking:
            tracker.checkpoint(step, checkpoint.step_dir(self.out, step))

    def take_over(self) -> None:
        """This worker became rank 0 (the old one was lost): it writes from now on."""
        self.main = True
        self.metrics = MetricsWriter(self._metrics_path(), append=True)

    def membership(self, change: dict[str, Any], caught_up: dict[str, Any] | None) -> None:
        """A membership change logged, after the step only another survivor completed."""
        if self.main and caught_up and caught_up["step"] > self.metrics.last_step:
            self.metrics.write(**caught_up)
        self.metrics.write(event="membership", **change)

    def close(self) -> None:
        self.bar.close()
        self.metrics.close()

    def abandon(self) -> None:
        """The run failed: the trackers are closed without a summary."""
        for tracker in self.tracking:
            tracker.close()

    def finish(self, summary: dict[str, Any], whole: nn.Module | None) -> None:
        """summary.json and model.pt (main only); the trackers told and closed."""
        if self.main and self.out:
            if whole is not None:
                torch.save(whole.state_dict(), os.path.join(self.out, "model.pt"))
            write_summary(self.out, summary)
        for tracker in self.tracking:
            tracker.finish(summary, self.main)
            tracker.close()
