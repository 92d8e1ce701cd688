"""Run outputs: metrics.jsonl (one object per logged step), summary.json, and step timers."""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

__all__ = ["MetricsWriter", "Timers", "write_summary"]


class Timers:
    """Wall seconds accumulated per phase (compute, communication, data, eval)."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)

    @contextmanager
    def time(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 6) for k, v in sorted(self.seconds.items())}


class MetricsWriter:
    """Appends one JSON object per line to ``metrics.jsonl`` (rank 0 only writes)."""

    def __init__(self, path: str | None, append: bool = False) -> None:
        mode = "a" if append else "w"  # append: an elastic restart goes on with the same run
        self._fh: IO[str] | None = open(path, mode) if path else None  # noqa: SIM115

    def write(self, **record: Any) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(record) + "\n")
            self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def write_summary(out_dir: str, summary: dict[str, Any]) -> str:
    """Write ``summary.json`` atomically (temporary file, then rename) and return its path."""
    path = os.path.join(out_dir, "summary.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(summary, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)
    return path
