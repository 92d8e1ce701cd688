"""One run of a comparison as the lab reports it (its spec, flags, summary or error).

The run itself is started by :func:`disttrain.launch.commands.train_run`, the one home for
starting ``disttrain`` commands outside the launchers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["RunResult"]


@dataclass
class RunResult:
    """One run of a comparison: the spec as written, its train flags, its summary or its error."""

    label: str
    flags: dict[str, Any]
    summary: dict[str, Any] | None = None  # summary.json, plus "metrics": metrics.jsonl's lines
    error: str = ""
    folder: str = ""  # the run's --out, kept (compare: REPORT/runs/run-NN)

    @property
    def evaluations(self) -> list[dict[str, Any]]:
        """The epoch-end lines of metrics.jsonl (the ones with a test loss)."""
        metrics = (self.summary or {}).get("metrics", [])
        return [m for m in metrics if "test_loss" in m]
