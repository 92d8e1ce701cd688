"""Local SGD's cost: one parameter allreduce every H steps."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from disttrain import costing
from disttrain.strategies.cost.base import StrategyCost
from disttrain.strategies.localsgd import LocalSGDConfig

if TYPE_CHECKING:
    pass

__all__ = ["LocalSGDCost"]


class LocalSGDCost(StrategyCost):
    """Step time of local SGD (``advise``); its convergence per step is not modelled."""

    cost_settings: ClassVar[tuple[str, ...]] = ("period", "algorithm")

    def advise_specs(self) -> list[str]:
        return [f"{self.name}:8", f"{self.name}:32"]

    def predict(self, q: costing.Question) -> costing.Prediction:
        """One parameter allreduce every H steps (the algorithm named, else the fastest by
        this model). Convergence per step differs: not modelled (the row's note says so)."""
        spec, work, nodes, network, calibration = q
        cfg = spec.config()
        period = cfg.section(LocalSGDConfig).period
        net, cal, n = network, calibration, nodes
        alg = (
            cfg.train.algorithm
            if "algorithm" in spec.settings
            else costing.fastest_allreduce(work, n, net, cal)
        )
        compute = costing.compute_seconds(work, n, cal)
        t, path = costing.allreduce_seconds(
            alg, work.gradient_bytes, n, net, cal, work.bytes_per_param
        )
        comm = t / period
        latency = path.steps * net.alpha > path.critical_bytes * net.beta
        bound = "latency" if latency else "bandwidth"  # or compute-bound: costing.finish
        reason = (
            f"one {alg} allreduce of the parameters every {period} steps: "
            f"{costing.mb(path.bytes_per_rank / period)}/step"
        )
        return costing.finish(
            spec.label,
            n,
            compute,
            comm,
            path.bytes_per_rank / period,
            path.messages_per_rank / period,
            bound,
            reason,
            work,
            cal,
            note="changes convergence per step",
        )
