"""Horovod's ``hvd.start_timeline(file_path, mark_cycles=False)`` and ``hvd.stop_timeline()``
on disttrain's timeline (:mod:`disttrain.timeline`).

While it records, the engine's thread adds two spans per collective it runs: the ranks'
agreement on the call (``NEGOTIATE_ALLREDUCE``, ...) and the data's move (``ALLREDUCE``,
...), each on a lane named after the call (``allreduce.loss``), as Horovod's timeline
shows one row per tensor name. ``stop_timeline()`` writes rank 0's spans to ``file_path``
as Chrome-trace JSON (Perfetto, chrome://tracing), as Horovod's coordinator writes the
file on rank 0 only; the other ranks write nothing. ``HOROVOD_TIMELINE=path`` at
``init()`` records from there to ``shutdown()``. Differs: ``mark_cycles`` is accepted and
marks nothing (no cycles here: calls run as they come), and the file holds rank 0's
view of its own calls, not the coordinator's record of every rank's readiness.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from disttrain import timeline
from disttrain.horovod import engine

__all__ = ["start_timeline", "stop_timeline"]

_path: str | None = None  # where stop_timeline writes


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Record every collective from now on; a second call starts over with ``file_path``."""
    global _path
    del mark_cycles  # nothing to mark (see the module doc)
    running = engine.current()  # Horovod's ValueError before init
    running.timeline = timeline.Recorder(running.rank)
    _path = file_path


def stop_timeline() -> None:
    """Stop recording; rank 0 writes what it recorded to the ``file_path`` it was given."""
    global _path
    running = engine.current()
    recorder, path = running.timeline, _path
    running.timeline, _path = None, None
    if recorder is None or path is None or running.rank != 0:
        return
    folder = tempfile.mkdtemp(prefix="hvd-timeline-")
    try:
        recorder.write(folder)
        timeline.merge(folder, os.path.abspath(path))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
