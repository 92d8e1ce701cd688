"""A timeline of a run: each rank records spans, written as Chrome-trace / Perfetto JSON and merged.

    with timeline.span("backward"): loss.backward()             # the training thread
    timeline.track(work, "allreduce", "comm", bucket=3, bytes=n) # until the Work completes

Every rank records into its own :class:`Recorder` and writes its events to
``rank{N}.json`` in a folder of part files; at the end of the run one process
merges the parts into one file in the Trace Event Format (``"ph": "X"`` complete
events, ``ts``/``dur`` in microseconds, ``pid`` = rank, ``tid`` = lane, and ``"M"``
metadata events naming each process ``rank N`` and each lane). Nothing crosses a
wire: the parts are plain JSON files.

The clock is ``time.monotonic_ns``: on Linux that is ``CLOCK_MONOTONIC``, one
clock for every process of a host (``perf_counter`` may be per process on other
systems), and it never jumps with NTP. Ranks on several hosts are aligned by each
rank's offset between the wall clock and its monotonic clock, so only as well as
the hosts' wall clocks agree; the merged file says which alignment it used.

Off (the default), the module's recorder is :data:`OFF`: every call returns at
once (``span`` hands back one shared do-nothing context manager), so call sites
need no ``if``.
"""

from __future__ import annotations

import glob
import json
import os
import re
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from types import TracebackType
from typing import Any

__all__ = [
    "LANES",
    "OFF",
    "NullRecorder",
    "Recorder",
    "current",
    "instant",
    "iterate",
    "merge",
    "parts_folder",
    "span",
    "start",
    "stop",
    "track",
]

CLOCK = time.monotonic_ns
#: Lanes in display order: the training thread, then communication in flight.
LANES = ("compute", "comm")
_PART = re.compile(r"rank(\d+)\.json$")


class NullRecorder:
    """The recorder when the timeline is off: records nothing, costs one call."""

    enabled = False
    _NULL: AbstractContextManager[None] = nullcontext()

    def span(self, name: str, lane: str = "compute", **args: Any) -> AbstractContextManager[Any]:
        return self._NULL

    def instant(self, name: str, lane: str = "compute", **args: Any) -> None:
        pass

    def track(
        self, work: Any, name: str, lane: str = "comm", in_order: bool = False, **args: Any
    ) -> None:
        pass

    def iterate(self, items: Iterable[Any], name: str, lane: str = "compute") -> Iterable[Any]:
        return items


OFF = NullRecorder()


class _Span:
    """One open span: on exit it becomes a complete ("X") event."""

    __slots__ = ("args", "lane", "name", "recorder", "start")

    def __init__(self, recorder: Recorder, name: str, lane: str, args: dict[str, Any]) -> None:
        self.recorder, self.name, self.lane, self.args = recorder, name, lane, args
        self.start = 0

    def __enter__(self) -> _Span:
        self.start = CLOCK()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.recorder.complete(self.name, self.lane, self.start, CLOCK(), **self.args)


class Recorder(NullRecorder):
    """Collects this process's events in memory (a list append per event, under the GIL)."""

    enabled = True

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.events: list[dict[str, Any]] = []
        self._lane_end: dict[str, int] = {}  # end of the last tracked span on each lane
        self._lock = threading.Lock()
        # the wall clock minus the monotonic clock, to align ranks of different hosts
        self.wall_offset_ns = time.time_ns() - CLOCK()

    def complete(self, name: str, lane: str, start_ns: int, end_ns: int, **args: Any) -> None:
        """Record a span from ``start_ns`` to ``end_ns`` (``CLOCK`` readings)."""
        event = {"name": name, "ph": "X", "tid": lane, "ts": start_ns, "dur": end_ns - start_ns}
        if args:
            event["args"] = args
        self.events.append(event)

    def span(self, name: str, lane: str = "compute", **args: Any) -> AbstractContextManager[Any]:
        return _Span(self, name, lane, args)

    def instant(self, name: str, lane: str = "compute", **args: Any) -> None:
        event = {"name": name, "ph": "i", "s": "t", "tid": lane, "ts": CLOCK()}
        if args:
            event["args"] = args
        self.events.append(event)

    def track(
        self, work: Any, name: str, lane: str = "comm", in_order: bool = False, **args: Any
    ) -> None:
        """A span for asynchronous work (a ``dist.Work`` or a ``Future``), ending when it does.

        It starts at the launch. With ``in_order`` (the work runs on an executor that does
        one thing at a time, in launch order, such as a communication thread) it starts
        when the previous tracked work on ``lane`` ended, if that was later, and
        ``queued_us`` says how long it waited. Otherwise (gloo may run collectives side by
        side) overlapping spans are spread over sub-lanes ``comm``, ``comm #2``... by
        :func:`merge`.
        """
        launched = CLOCK()
        future = work.get_future() if hasattr(work, "get_future") else work

        def done(_: Any) -> None:
            end = CLOCK()
            start = launched
            if in_order:
                with self._lock:
                    start = min(max(launched, self._lane_end.get(lane, 0)), end)
                    self._lane_end[lane] = end
                args["queued_us"] = round((start - launched) / 1000, 3)
            # "async": it may overlap the lane's other tracked spans (see merge)
            event = {"name": name, "ph": "X", "tid": lane, "ts": start, "dur": end - start}
            self.events.append({**event, "args": args, "async": True})

        future.add_done_callback(done)

    def iterate(self, items: Iterable[Any], name: str, lane: str = "compute") -> Iterator[Any]:
        """``items``, with a span around each wait for the next one (e.g. a data loader)."""
        it = iter(items)
        while True:
            start = CLOCK()
            try:
                item = next(it)
            except StopIteration:
                return
            self.complete(name, lane, start, CLOCK())
            yield item

    def part(self) -> dict[str, Any]:
        """This rank's part file: its events (``ts``/``dur`` still in ns) and its clock."""
        return {
            "rank": self.rank,
            "host": socket.gethostname(),
            "clock": "CLOCK_MONOTONIC (time.monotonic_ns)",
            "wall_offset_ns": self.wall_offset_ns,
            "events": list(self.events),
        }

    def write(self, folder: str) -> str:
        """Write this rank's part into ``folder``; return its path."""
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"rank{self.rank}.json")
        tmp = f"{path}.tmp"
        with open(tmp, "w") as fh:
            json.dump(self.part(), fh)
        os.replace(tmp, path)  # a merge never reads half a part
        return path


_current: NullRecorder = OFF


def current() -> NullRecorder:
    """The recorder in use in this process (:data:`OFF` unless :func:`start` was called)."""
    return _current


def start(rank: int) -> Recorder:
    """Record from now on in this process, as rank ``rank``."""
    global _current
    recorder = Recorder(rank)
    _current = recorder
    return recorder


def stop() -> None:
    """Stop recording in this process (the recorder keeps what it has)."""
    global _current
    _current = OFF


def span(name: str, lane: str = "compute", **args: Any) -> AbstractContextManager[Any]:
    """A context manager that records a span of ``name`` on ``lane`` (nothing when off)."""
    return _current.span(name, lane, **args)


def instant(name: str, lane: str = "compute", **args: Any) -> None:
    """Record a moment (an ``"i"`` event)."""
    _current.instant(name, lane, **args)


def track(work: Any, name: str, lane: str = "comm", in_order: bool = False, **args: Any) -> None:
    """Record asynchronous ``work`` from now until it completes (see :meth:`Recorder.track`)."""
    _current.track(work, name, lane, in_order, **args)


def iterate(items: Iterable[Any], name: str, lane: str = "compute") -> Iterable[Any]:
    """``items``, each wait for the next recorded as a span (``items`` itself when off)."""
    return _current.iterate(items, name, lane)


def parts_folder(out: str, path: str) -> str:
    """Where ranks write their parts: ``OUT/timeline``, or ``PATH.parts`` without an out dir."""
    return os.path.join(out, "timeline") if out else f"{path}.parts"


# --- merging -----------------------------------------------------------------------------
def _spread(events: list[dict[str, Any]]) -> None:
    """Put overlapping asynchronous spans of one rank on sub-lanes (first one free, greedily).

    Complete events of one thread must nest; two collectives gloo runs side by side
    overlap without nesting, so the second goes to ``LANE #2``.
    """
    ends: dict[str, list[int]] = {}
    for e in sorted((e for e in events if e.pop("async", False)), key=lambda e: e["ts"]):
        lane = e["tid"]
        free = ends.setdefault(lane, [])
        i = next((i for i, end in enumerate(free) if end <= e["ts"]), len(free))
        if i == len(free):
            free.append(0)
        free[i] = e["ts"] + e["dur"]
        e["tid"] = lane if i == 0 else f"{lane} #{i + 1}"


def _lane_ids(parts: list[dict[str, Any]]) -> dict[str, int]:
    names = {e["tid"] for p in parts for e in p["events"]}
    order = [*LANES, *(f"{lane} #{i}" for lane in LANES for i in range(2, 9))]
    ordered = [n for n in order if n in names] + sorted(names - set(order))
    return {name: i + 1 for i, name in enumerate(ordered)}


def merge(folder: str, path: str) -> dict[str, Any]:
    """Merge the part files in ``folder`` into one trace at ``path``; return its summary.

    Times become microseconds from the earliest event of the run. All parts from one
    host keep the shared monotonic clock; parts from several hosts are put on the wall
    clock by each one's offset.
    """
    parts = []
    for name in sorted(glob.glob(os.path.join(folder, "rank*.json"))):
        if _PART.search(name):
            with open(name) as fh:
                parts.append(json.load(fh))
    parts.sort(key=lambda p: int(p["rank"]))
    one_host = len({p["host"] for p in parts}) <= 1
    for p in parts:
        _spread(p["events"])
        shift = 0 if one_host else p["wall_offset_ns"]
        for e in p["events"]:
            e["ts"] += shift
    origin = min((e["ts"] for p in parts for e in p["events"]), default=0)
    lanes = _lane_ids(parts)
    events: list[dict[str, Any]] = []
    for p in parts:
        rank = int(p["rank"])
        events.append(_meta("process_name", rank, 0, name=f"rank {rank}"))
        events.append(_meta("process_sort_index", rank, 0, sort_index=rank))
        used = {e["tid"] for e in p["events"]}
        for lane, tid in lanes.items():
            if lane in used:
                events.append(_meta("thread_name", rank, tid, name=lane))
                events.append(_meta("thread_sort_index", rank, tid, sort_index=tid))
        # enclosing spans first where two start together (viewers nest them so)
        for e in sorted(p["events"], key=lambda e: (e["ts"], -e.get("dur", 0))):
            out = {
                **e,
                "pid": rank,
                "tid": lanes[e["tid"]],
                "ts": round((e["ts"] - origin) / 1000, 3),
            }
            if "dur" in e:
                out["dur"] = round(e["dur"] / 1000, 3)
            events.append(out)
    trace: dict[str, Any] = {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "clock": "CLOCK_MONOTONIC" if one_host else "wall clock (hosts differ)",
            "ranks": [int(p["rank"]) for p in parts],
        },
    }
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(trace, fh)
    os.replace(tmp, path)
    return dict(trace["otherData"])


def _meta(kind: str, pid: int, tid: int, **args: Any) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": args}
