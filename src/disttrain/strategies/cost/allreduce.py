"""The allreduce strategy's cost: fused buckets, one allreduce each, overlapped with backward."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from disttrain import collectives, costing
from disttrain.compression.base import CollectiveCompressor, LayerAware
from disttrain.compression.casts import cast_dtype
from disttrain.compression.config import CompressionConfig
from disttrain.compression.registry import parse
from disttrain.strategies.allreduce import DataParallelConfig
from disttrain.strategies.cost.base import Mesh, StrategyCost, mesh_settings

if TYPE_CHECKING:
    from disttrain.strategies.runspec import RunSpec

__all__ = ["AllReduceCost", "allreduces"]


class AllReduceCost(StrategyCost):
    """Step time of the allreduce strategy (``advise``)."""

    cost_settings: ClassVar[tuple[str, ...]] = ("algorithm", "fusion_mb", "overlap", "compression")

    def mesh(self, settings: Mapping[str, Any], gpus: int) -> Mesh:
        """``allreduce``: a whole replica on each of the GPUs (the scenario model reads none
        of its settings: it times the library's own allreduce)."""
        mesh_settings(self.name, settings, ())
        return Mesh(gpus)

    def advise_specs(self) -> list[str]:
        # one row per algorithm; an estimated one (native: gloo's ring) is modelled as another;
        # a one-host one (shm) is asked for by name (its ranks must share a host), and so is
        # one that chooses per size (auto: the fastest of the rows, by construction)
        return [
            f"{self.name}:{a}"
            for a, algo in collectives.ALGORITHMS.items()
            if not algo.estimated
            and not algo.one_host
            and not isinstance(collectives.get(a), collectives.Chooses)
        ]

    def predict(self, q: costing.Question) -> costing.Prediction:
        """Gradients in fusion buckets, one allreduce each; with overlap the buckets but the
        last hide behind backward (≈ 2/3 of compute). ``compression=`` a cast sends the same
        buckets in its type; a collective compressor (PowerSGD) is its own rounds."""
        spec, work, nodes, network, calibration = q
        cfg = spec.config()
        dp: DataParallelConfig = cfg.section(DataParallelConfig)
        alg, net, cal = cfg.train.algorithm, network, calibration
        if "compression" in spec.settings:
            compressor = parse(cfg.section(CompressionConfig).compression)
            dtype = cast_dtype(compressor)
            if isinstance(compressor, CollectiveCompressor):
                return self._predict_collective(spec, compressor, work, nodes, net, cal)
            if dtype is None:
                raise costing.NotModelled(
                    f"allreduce with --compression {compressor.spec} is not modelled here: its "
                    f"payloads go to every peer point to point, as decentralized:"
                    f"{compressor.spec} models them"
                )
            work = replace(work, bytes_per_param=dtype.itemsize)
        if "fusion_mb" in spec.settings:
            work = replace(work, bucket_bytes=int(dp.fusion_mb * (1 << 20)), buckets=None)
        if "overlap" in spec.settings:
            work = replace(work, overlap=dp.overlap)
        n = nodes
        compute = costing.compute_seconds(work, n, cal)
        sizes = (
            list(work.buckets)
            if work.buckets
            else costing.bucket_sizes(work.gradient_bytes, work.bucket_bytes)
        )
        total, last, terms, sent, msgs, biggest = allreduces(
            alg, sizes, n, net, cal, work.bytes_per_param
        )
        exposed = total
        if work.overlap:  # every bucket but the last can run during backward (2/3 of compute)
            exposed = max(last, total - compute * 2 / 3)
        exposed += cal.sync_seconds(n)  # the step waits for the slowest rank
        bound = costing.bound_of(terms)
        reason = "one rank: nothing to send"
        if biggest is not None and n > 1:
            reason = costing.describe_allreduce(bound, biggest, max(sizes), len(sizes), net)
        return costing.finish(spec.label, n, compute, exposed, sent, msgs, bound, reason, work, cal)

    def _predict_collective(
        self,
        spec: RunSpec,
        compressor: CollectiveCompressor,
        work: costing.Workload,
        n: int,
        net: costing.Network,
        cal: costing.Rates,
    ) -> costing.Prediction:
        """The compressor's own rounds (PowerSGD: the small tensors, P, Q), each one fp32
        allreduce after backward, unfused and not overlapped, plus its codec's flops at the
        calibrated matmul rate (the steady state, after --powersgd-start-step)."""
        if work.shapes is None:
            raise ValueError(
                f"--compression {compressor.spec} sends what the layer shapes give: the "
                "workload needs them (advise: --model, or --params with --layers)"
            )
        if isinstance(compressor, LayerAware):
            compressor.bind_shapes([torch.Size(s) for s in work.shapes])
        rounds = [4 * k for k in compressor.round_numels(work.params)]  # fp32 sums
        alg = spec.config().train.algorithm
        compute = costing.compute_seconds(work, n, cal)
        total, _, terms, sent, msgs, biggest = allreduces(alg, rounds, n, net, cal, 4)
        flops = compressor.codec_flops(work.params)
        # on the cores the step computes on: slowed as compute is by ranks sharing a host
        codec = flops * cal.seconds_per_flop * cal.colocation_factor(work.ranks_per_host)
        terms["encode"] = codec
        bound = costing.bound_of(terms)
        dense = 4 * work.params
        what = (
            f"{compressor.spec}: {len(rounds)} {alg} allreduces of "
            f"{costing.mb(sum(rounds))} ({dense / max(1, sum(rounds)):.3g}x fewer entries)"
        )
        reason = f"{bound}-bound: {what}"
        if bound == "encode":
            reason = f"codec-bound: {flops / 1e6:.3g} MFLOP of low-rank matmuls; {what}"
        if biggest is None or n == 1:
            reason = f"one rank: nothing to send; {compressor.spec} codec"
        comm = total + codec + cal.sync_seconds(n)  # its rounds end the step, as dense ones do
        return costing.finish(spec.label, n, compute, comm, sent, msgs, bound, reason, work, cal)


def allreduces(
    alg: str, sizes: list[int], n: int, net: costing.Network, cal: costing.Rates, itemsize: int
) -> tuple[float, float, dict[str, float], int, float, costing.CriticalPath | None]:
    """One allreduce of each size in turn: (seconds, the last one's seconds, the latency,
    bandwidth and reduction terms, bytes and messages per rank, the biggest critical path)."""
    gamma = costing.gamma_of(net, cal)
    total = last = 0.0
    terms = {"latency": 0.0, "bandwidth": 0.0, "reduction": 0.0}
    sent, msgs = 0, 0.0
    biggest: costing.CriticalPath | None = None
    for size in sizes:
        t, path = costing.allreduce_seconds(alg, size, n, net, cal, itemsize)
        total += t
        last = t
        sent += path.bytes_per_rank
        msgs += path.messages_per_rank
        if net.shared_host:
            terms["latency"] += path.steps * net.alpha + path.total_messages * net.delta
            terms["bandwidth"] += path.total_bytes * net.beta
        else:
            terms["latency"] += path.steps * net.alpha
            terms["bandwidth"] += path.critical_bytes * net.beta
            terms["reduction"] += path.reduced_bytes * gamma
        if biggest is None or biggest.critical_bytes < path.critical_bytes:
            biggest = path
    return total, last, terms, sent, msgs, biggest
