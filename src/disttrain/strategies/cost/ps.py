"""The parameter servers' cost: pushes and pulls per worker, n·S/K per server link."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from torch import nn

from disttrain import costing
from disttrain.ps.config import PSConfig
from disttrain.strategies.cost.base import StrategyCost

if TYPE_CHECKING:
    from disttrain.strategies.runspec import RunSpec

__all__ = ["PSCost"]


class PSCost(StrategyCost):
    """Step time and memory of the parameter servers, sync and async (``advise``)."""

    cost_settings: ClassVar[tuple[str, ...]] = ("ps_mode", "servers")

    def advise_specs(self) -> list[str]:
        return [f"{self.name}:sync", f"{self.name}:async"]

    def predict(self, q: costing.Question) -> costing.Prediction:
        """A worker pushes S and pulls S; a server moves n·S/K each way per round. Sync waits
        for the round; async is bound by the slower of the worker's own loop and the servers."""
        spec, work, nodes, network, calibration = q
        ps: PSConfig = spec.config().section(PSConfig)
        if ps.ps_mode not in ("sync", "async"):
            raise ValueError(f"ps mode {ps.ps_mode!r} is not modelled: use ps:sync or ps:async")
        net, cal, n = network, calibration, nodes
        k = max(1, ps.servers if "servers" in spec.settings else work.servers)
        s = work.gradient_bytes
        compute = costing.compute_seconds(work, n, cal)
        # worker side: K messages of S/K out (push) and in (pull)
        worker = 2 * (k * net.alpha + s * net.beta)
        # server side per round: n messages of S/K in, sum them, n out; optimizer on P/K params
        server = (
            2 * (n * net.alpha + n * s / k * net.beta)
            + n * s / k * costing.gamma_of(net, cal)
            + work.params / k * cal.seconds_per_param
        )
        # async: no barrier, a worker's own loop unless the servers cannot keep up with n of them
        comm = max(worker, server) if ps.ps_mode == "sync" else max(worker, server - compute)
        bound = "server" if server >= worker else "bandwidth"
        reason = (
            f"server link: n·S/K = {costing.mb(n * s / k)} each way per round (K={k})"
            if bound == "server"
            else f"worker link: 2S = {costing.mb(2 * s)} per step"
        )
        note = "stale gradients" if ps.ps_mode == "async" else ""
        return costing.finish(
            spec.label, n, compute, max(comm, 0.0), 2 * s, 2 * k, bound, reason, work, cal, note
        )

    def predict_memory(
        self, spec: RunSpec, work: costing.Workload, nodes: int, model: nn.Module
    ) -> costing.Memory:
        """A worker holds the parameters and, from its backward to its push, their
        gradients; the optimizer state lives on the servers (each 1/K of it)."""
        del spec, nodes, model
        return costing.worker_memory(work, work.params, state=0)
