"""Run outputs: metrics.jsonl (one object per logged step), summary.json, timers, throughput."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from disttrain.comm import phases

__all__ = ["MetricsWriter", "Throughput", "Timers", "write_summary"]


class Timers:
    """Wall seconds of the training thread per phase (compute, communication, codec, data, ...).

    Phases nest (:mod:`disttrain.comm.phases`): a pipeline stage's wait for its
    neighbour inside ``compute`` is booked as ``communication`` and taken out of
    ``compute``, so every second is booked once and the parts add up to at most
    the wall time.
    """

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)

    @contextmanager
    def time(self, phase: str) -> Iterator[None]:
        with phases.book(phase, self.seconds):
            yield

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 6) for k, v in sorted(self.seconds.items())}


class Throughput:
    """Samples per second of this process: the steps it ran over the seconds since it started.

    After ``--resume`` (or an elastic restart) the restored steps were run by
    another process in another time: counting them over this process's seconds
    would inflate the figure (2x when resuming half way). So

        samples/s = (step - first_step) x global batch / seconds since ``start``
    """

    def __init__(self, batch_size: int, start: float | None = None) -> None:
        self.batch_size = batch_size
        self.start = time.perf_counter() if start is None else start
        self.first_step = 0  # the step this process started from (a resume's)

    def resumed_at(self, step: int) -> None:
        self.first_step = step

    def steps_run(self, step: int) -> int:
        return step - self.first_step

    def elapsed(self, now: float | None = None) -> float:
        return (time.perf_counter() if now is None else now) - self.start

    def samples_per_second(self, step: int, seconds: float) -> float:
        """Global samples/s of the steps run up to ``step`` in ``seconds`` of this process."""
        return self.steps_run(step) * self.batch_size / max(seconds, 1e-9)


class MetricsWriter:
    """Appends one JSON object per line to ``metrics.jsonl`` (rank 0 only writes)."""

    def __init__(self, path: str | None, append: bool = False) -> None:
        #: the highest step with a training line (``loss``) in the file: a rank 0 that takes
        #: over after a membership change writes a step another worker ran only once
        self.last_step = 0
        cut = False  # the file ends in a line a crash cut short: start on a new line
        if append and path and os.path.exists(path):
            with open(path) as fh:
                for line in fh:
                    cut = not line.endswith("\n")
                    with contextlib.suppress(ValueError):
                        self._saw(json.loads(line))
        mode = "a" if append else "w"  # append: an elastic restart goes on with the same run
        self._fh: IO[str] | None = open(path, mode) if path else None  # noqa: SIM115
        if cut and self._fh is not None:
            self._fh.write("\n")

    def _saw(self, record: dict[str, Any]) -> None:
        if "loss" in record and isinstance(record.get("step"), int):
            self.last_step = max(self.last_step, record["step"])

    def write(self, **record: Any) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(record) + "\n")
            self._fh.flush()
            self._saw(record)

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
