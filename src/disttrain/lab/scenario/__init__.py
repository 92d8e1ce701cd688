"""Predict a published cluster's training speed from a scenario file (issue 38, part 2).

- :mod:`.models`: the named models' layers (parameters, FLOPs) and their sources;
- :mod:`.hardware`: intra-node presets and inter-node fabrics, with sources;
- :mod:`.spec` and :mod:`.reader`: the scenario file and its checks;
- :mod:`.collectives`: NCCL's ring and tree on two levels;
- :mod:`.steptime`: one step's time and its parts;
- :mod:`.measured`: the one-GPU rate backed out of a run the user timed (``[measured]``);
- :mod:`.command`: ``disttrain advise --scenario FILE --json OUT``.
"""

from __future__ import annotations

from disttrain.lab.scenario.reader import ScenarioError, load, parse
from disttrain.lab.scenario.steptime import Prediction, predict

__all__ = ["Prediction", "ScenarioError", "load", "parse", "predict"]
