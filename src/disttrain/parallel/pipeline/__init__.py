"""Pipeline parallelism: schedules as plain data (schedule.py, one file per family) and
their executor (runner.py)."""

from disttrain.parallel.pipeline import interleaved, zerobubble
from disttrain.parallel.pipeline.schedule import SCHEDULES, Action, gpipe, one_f_one_b, render

__all__ = ["SCHEDULES", "Action", "gpipe", "interleaved", "one_f_one_b", "render", "zerobubble"]
