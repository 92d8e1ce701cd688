"""``dt.distribute``: the user's model, optimizer, data and loss through every strategy
(docs/training.md, "Your own loop"). ``settings.py`` turns keywords into a run's settings,
``run.py`` is the object a script drives, ``loader.py`` its data and the data's position."""

from disttrain.api.run import DistributedRun, distribute

__all__ = ["DistributedRun", "distribute"]
