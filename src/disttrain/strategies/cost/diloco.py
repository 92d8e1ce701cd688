"""DiLoCo's cost: local SGD's term with the outer gradients in their dtype, streamed."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar

from disttrain import costing
from disttrain.strategies.cost.localsgd import LocalSGDCost
from disttrain.strategies.diloco import DTYPES, DiLoCoConfig
from disttrain.strategies.localsgd import LocalSGDConfig

if TYPE_CHECKING:
    pass

__all__ = ["DiLoCoCost"]


class DiLoCoCost(LocalSGDCost):
    """Step time of DiLoCo (``advise``); its convergence per step is not modelled."""

    cost_settings: ClassVar[tuple[str, ...]] = ("period", "algorithm", "outer_dtype", "fragments")

    def advise_specs(self) -> list[str]:
        return [f"{self.name}:50", f"{self.name}:200"]

    def predict(self, q: costing.Question) -> costing.Prediction:
        """Local SGD's term (one model-sized allreduce every H steps) with the outer gradients
        in ``--outer-dtype``; streaming sends 1/F of it F times per period, overlapped with an
        inner step, so its exposed part is what exceeds one step's compute."""
        spec, work, nodes, _, calibration = q
        cfg = spec.config()
        dc: DiLoCoConfig = cfg.section(DiLoCoConfig)
        h, f = cfg.section(LocalSGDConfig).period, dc.fragments
        if dc.outer_dtype not in DTYPES:
            raise costing.NotModelled(
                f"--outer-dtype {dc.outer_dtype} is gathered, not summed: an all-gather of "
                "every worker's codes, not modelled (compression/blockquant.py gives its bytes)"
            )
        sent = replace(work, bytes_per_param=DTYPES[dc.outer_dtype].itemsize)
        pred = super().predict(q._replace(work=sent))
        reason = f"outer gradients in {dc.outer_dtype}; {pred.reason}"
        comm = pred.comm_seconds
        if f > 1:  # one fragment (1/F of a sync) per sync step, hidden behind one inner step
            comm = max(0.0, comm * h / f - pred.compute_seconds) * f / h
            reason += f"; {f} fragments, each overlapped with an inner step"
        return costing.finish(
            spec.label,
            nodes,
            pred.compute_seconds,
            comm,
            pred.bytes_per_rank,
            pred.messages_per_rank,
            pred.bound,
            reason,
            sent,
            calibration,
            note="changes convergence per step",
        )
