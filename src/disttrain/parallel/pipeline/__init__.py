"""Pipeline parallelism: schedules as plain data (schedule.py) and their executor (runner.py)."""

from disttrain.parallel.pipeline.schedule import Action, gpipe, one_f_one_b, render

__all__ = ["Action", "gpipe", "one_f_one_b", "render"]
