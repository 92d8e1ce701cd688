"""The interface of a strategy's cost part, and the plain defaults (a whole replica each)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from torch import nn

from disttrain.costing import Memory, NotModelled, Prediction, Question, Workload
from disttrain.costing import worker_memory as replica_bytes

if TYPE_CHECKING:
    from disttrain.strategies.runspec import RunSpec

__all__ = ["Mesh", "StrategyCost", "mesh_settings"]


class Mesh(NamedTuple):
    """The ranks a strategy's settings lay out on G GPUs, as the lab's scenario step-time
    model reads them (``disttrain advise --scenario``): D data-parallel replicas of T tensor
    slices by P pipeline stages (D·T·P = G), V model chunks per stage, ZeRO stage Z (0: none)."""

    dp: int
    tp: int = 1
    pp: int = 1
    vp: int = 1
    zero: int = 0


def mesh_settings(name: str, settings: Mapping[str, Any], reads: tuple[str, ...]) -> None:
    """ValueError naming the first of ``settings`` that the mesh of ``name`` does not read,
    or a whole-number one below 0 (0: the setting's own default)."""
    for key, value in settings.items():
        flag = key.replace("_", "-")
        if key not in reads:
            also = f" (it reads {', '.join(reads)})" if reads else ""
            raise ValueError(f"the scenario model of {name} does not read {flag}{also}")
        if isinstance(value, int) and value < 0:
            raise ValueError(f"{flag}={value} must be at least 0")


class StrategyCost:
    """A strategy's step time and memory, for ``disttrain advise`` and the memory plan.

    Built with the name the strategy is registered under (a plug-in that reuses another's
    cost part gets rows of its own name).
    """

    #: The spec settings ``predict`` and ``predict_memory`` read; any other in an
    #: ``advise`` spec is refused.
    cost_settings: ClassVar[tuple[str, ...]] = ()
    #: Cost-model-only spec keys (``advise``): name -> what it states.
    assumptions: ClassVar[dict[str, str]] = {}
    #: Why ``predict`` cannot model this strategy (the default ``predict`` says it).
    not_modelled: ClassVar[str] = "it has no cost formula (no predict method)"

    def __init__(self, name: str) -> None:
        self.name = name

    def mesh(self, settings: Mapping[str, Any], gpus: int) -> Mesh:
        """The mesh a spec's ``settings`` (``RunSpec.settings``) make on ``gpus`` GPUs, for
        the lab's scenario model; ValueError (one line naming the setting) where they make
        none. The default: none (the scenario model has no formula for this strategy)."""
        del settings, gpus
        raise ValueError(
            f"{self.name} is not a scenario strategy (the scenario model has no mesh for it)"
        )

    def advise_specs(self) -> list[str]:
        """The specs ``disttrain advise`` ranks when none are named (none: not modelled)."""
        return []

    def memory_specs(self) -> list[str]:
        """Specs ``advise`` lists for their memory alone (no step-time formula)."""
        return []

    def predict(self, q: Question) -> Prediction:
        """The predicted step of ``q.spec`` on ``q.nodes`` ranks; NotModelled if not modelled."""
        del q
        raise NotModelled(f"{self.name} is not modelled: {self.not_modelled}")

    def predict_memory(self, spec: RunSpec, work: Workload, nodes: int, model: nn.Module) -> Memory:
        """The bytes the fullest of ``nodes`` workers holds training ``model`` (its layers;
        ``work.params`` parameters in all), the figures the trainer's memory count gives;
        ValueError if ``spec`` cannot run so. The default: every worker a whole replica,
        4Ψ parameters + 4Ψ gradients + the optimizer's state (Adam 8Ψ: 16Ψ in all)."""
        del spec, nodes, model
        return replica_bytes(work, work.params)
