"""L2: model parallelism: layer placement, pipelines (schedules as data), tensor slicing, mesh."""

from disttrain.parallel.pipeline.schedule import Action, gpipe, one_f_one_b, render

__all__ = ["Action", "gpipe", "one_f_one_b", "render"]
