"""Synchronous data parallelism: fused gradient buckets averaged by an allreduce, during backward.

N workers at global batch B then take exactly the steps one process takes at
batch B: each worker's loss is the mean over its B/N samples, so the mean of
the N gradients is the gradient of the mean loss over all B. With
``--accumulate K`` each worker splits its shard into K micro-batches, weights
each loss by its share of the shard, and communicates only after the last one:
still one step of the same global batch, with 1/K of the activation memory.
The mechanics (buckets, hooks, the communication thread) live in
:mod:`disttrain.dataparallel.reducer`.

``--compression fp16|bf16`` (a cast) sends the same fused buckets in 16 bits,
overlapped as usual: the one spelling of 16-bit gradients. A sparse compressor
(``topk:R``, ``onebit:T``) instead exchanges one compressed payload with every
peer after backward, with error feedback: it reads neither ``--fusion-mb``,
``--overlap`` nor ``--accumulate`` (nor ``--algorithm``, unless its payloads are
summable), and pre-flight refuses them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from disttrain import collectives, costing, timeline
from disttrain.comm.errors import UsageError
from disttrain.comm.world import World
from disttrain.compression.base import CollectiveCompressor, Configurable, LayerAware, Stateful
from disttrain.compression.casts import cast_dtype
from disttrain.compression.config import CompressionConfig
from disttrain.compression.error_feedback import ErrorFeedback
from disttrain.compression.exchange import (
    CompressionStats,
    compressed_all_reduce,
    compression_figures,
)
from disttrain.compression.registry import parse, section_of, sections
from disttrain.compression.starved import StarvedCheck
from disttrain.config import RunConfig, field_names, opt, register_section
from disttrain.dataparallel.accumulate import accumulated_forward_backward
from disttrain.dataparallel.average import average
from disttrain.dataparallel.broadcast import broadcast_tensors
from disttrain.dataparallel.fusion import FlatBucket
from disttrain.dataparallel.reducer import Reducer
from disttrain.strategies.base import Strategy, register

if TYPE_CHECKING:
    from disttrain.strategies.runspec import RunSpec

__all__ = ["AllReduce", "DataParallelConfig", "broadcast_tensors"]

#: The --fusion-mb default, chosen by `disttrain bench dp --sweep` (docs/data-parallel.md).
DEFAULT_FUSION_MB = 4.0


@register_section
@dataclass(frozen=True)
class DataParallelConfig:
    """Settings of the synchronous data-parallel engine (tensor fusion, overlap, accumulation)."""

    fusion_mb: float = opt(
        DEFAULT_FUSION_MB, "tensor fusion: gradient bucket size in MB (0: one allreduce per tensor)"
    )
    overlap: bool = opt(True, "start each bucket's allreduce during backward, once it is full")
    accumulate: int = opt(1, "micro-batches per optimizer step (accumulation), one allreduce")

    def validate(self) -> None:
        if self.fusion_mb < 0:
            raise UsageError(f"--fusion-mb must be >= 0, got {self.fusion_mb}")
        if self.accumulate < 1:
            raise UsageError(f"--accumulate must be >= 1, got {self.accumulate}")


@register
class AllReduce(Strategy):
    """Average gradients with ``--algorithm``, fused into buckets, overlapped with backward."""

    name = "allreduce"
    # the compressors' own sections too (--powersgd-start-step), each read with its compressor
    reads_settings = (DataParallelConfig, CompressionConfig, "algorithm", *sections())
    # Replicas are equal: a resume on M workers takes them as they are; per-worker error
    # feedback residuals are averaged (their mean is what the next average adds back).
    reshards = True
    # Buckets may be summed during backward: under fp16 the trainer unscales after the
    # sum (a sum carries any rank's Inf/NaN to all). Also right with --no-overlap.
    communicates_during_backward = True
    main_setting: ClassVar[str | None] = "algorithm"
    cost_settings: ClassVar[tuple[str, ...]] = ("algorithm", "fusion_mb", "overlap", "compression")

    @classmethod
    def settings_not_read(cls, config: RunConfig) -> dict[str, str]:
        spec = config.section(CompressionConfig).compression
        compressor = parse(spec)
        own = section_of(spec)
        others = [s for s in sections() if s is not own]
        unread = dict.fromkeys(field_names(tuple(others)), f"with --compression {spec}")
        if cast_dtype(compressor) is not None:  # the reducer's buckets, cast: nothing left out
            why = "nothing is compressed" if spec == "none" else "a cast leaves nothing out"
            return {**unread, "error_feedback": f"with --compression {spec} ({why})"}
        why = f"with --compression {spec} (one payload per peer after backward, unfused)"
        unread.update(dict.fromkeys(("fusion_mb", "overlap", "accumulate"), why))
        if not compressor.summable:  # sent to every peer point to point, no allreduce
            unread["algorithm"] = why
        return unread

    # Live shrink (--min-workers): the survivors regroup and redo the step (``regroup``)
    shrinks = True
    # Live grow (--max-workers): a joiner gets rank 0's replica over the new group
    grows = True

    @classmethod
    def validate_config(cls, config: RunConfig, model: nn.Module) -> None:
        super().validate_config(config, model)
        spec = config.section(CompressionConfig).compression
        if config.train.live_shrink and cast_dtype(parse(spec)) is None:
            raise UsageError(
                f"--min-workers with --compression {spec}: a failed step's error feedback "
                "cannot be rolled back; use --compression none, fp16 or bf16"
            )
        if config.train.live_grow and cast_dtype(parse(spec)) is None:
            raise UsageError(
                f"--max-workers with --compression {spec}: a joiner has no error feedback "
                "of its own to go on from; use --compression none, fp16 or bf16"
            )

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        super().setup(model, optimizer)
        if self.world.world_size > 1:
            broadcast_tensors(list(model.state_dict().values()), 0, self.worker_group)
        cc = self.config.section(CompressionConfig)
        compressor = parse(cc.compression)
        self.accumulate = 1
        self.compressor = None if cast_dtype(compressor) is not None else compressor
        if self.compressor is not None:
            # Compressed payloads are summed after backward (sparse ones are all-gathered
            # and decoded), so the step runner unscales fp16 gradients before sending.
            self.communicates_during_backward = False
            if isinstance(self.compressor, Configurable):
                self.compressor.configure(self.config)
            self.feedback = ErrorFeedback(self.compressor, enabled=cc.error_feedback)
            self.stats = CompressionStats(starved=StarvedCheck(self.compressor))
            # only summable payloads ride an allreduce; the others go to every peer
            self.algorithm = self.config.train.algorithm if self.compressor.summable else ""
            return
        self.accumulate = self.config.section(DataParallelConfig).accumulate
        self.reducer = self._reducer()

    def _reducer(self) -> Reducer:
        dp: DataParallelConfig = self.config.section(DataParallelConfig)
        return Reducer(
            list(self.model.parameters()),
            algorithm=self.config.train.algorithm,
            fusion_mb=dp.fusion_mb,
            overlap=dp.overlap,
            group=self.worker_group,
            world_size=self.world.world_size,
            # a cast: the buckets travel in its type
            compression=self.config.section(CompressionConfig).compression,
        )

    def abandon_step(self) -> None:
        if self.compressor is None:
            self.reducer.abandon()

    def regroup(self, world: World) -> None:
        """Replicas are equal: only the reducer's buckets (scaled by 1/n), hooks and groups
        are remade for the survivors; the check before sending carries over."""
        self.world = world
        check = self.reducer.before_send
        self.reducer.close()
        self.reducer = self._reducer()
        self.reducer.before_send = check

    def no_sync(self) -> Any:
        """Backward passes inside accumulate locally; the next one outside communicates."""
        return self.reducer.no_sync()

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.accumulate == 1:
            return super().forward_backward(x, y)
        return accumulated_forward_backward(
            self.model, self.loss_fn, x, y, self.accumulate, self.reducer.no_sync
        )

    def check_before_send(self, check: Callable[[FlatBucket], None]) -> bool:
        if self.compressor is not None:  # compressed payloads are sent after backward
            return False
        self.reducer.before_send = check
        return True

    def after_backward(self) -> None:
        if self.compressor is not None:
            with timeline.span("compressed allreduce", compression=self.compressor.spec):
                self._compressed_average()
            return
        # With overlap, most buckets are already on the wire; this waits for the rest.
        self.reducer.synchronize()

    def _compressed_average(self) -> None:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        compressor = self.compressor
        assert compressor is not None
        if isinstance(compressor, LayerAware):  # per-layer compressors (low rank)
            compressor.bind_shapes([g.shape for g in grads])

        def compressed_mean(flat: torch.Tensor) -> None:
            compressed_all_reduce(
                flat,
                compressor,
                self.algorithm or "native",
                self.worker_group,
                self.feedback,
                self.stats,
                mean=True,
            )

        average(
            grads, group=self.worker_group, world_size=self.world.world_size, mean_=compressed_mean
        )

    def finish(self) -> None:
        if self.compressor is None:
            self.reducer.close()

    def step_metrics(self) -> dict[str, Any]:
        if self.compressor is None:
            return {}
        return {
            **compression_figures(self.stats),
            "residual_norm": self.feedback.residual_norm(),
            **(self.compressor.figures() if isinstance(self.compressor, Stateful) else {}),
        }

    def summary(self) -> dict[str, Any]:
        if self.compressor is not None:
            return self.step_metrics()
        stats = self.reducer.stats()
        return {"data_parallel": {**stats, "accumulate": self.accumulate}}

    def replicated_state(self) -> set[str]:
        # every worker applies the same averaged gradient (the collectives hand every rank
        # the same bytes) from the same start, so parameters and optimizer state are equal;
        # buffers (BatchNorm's statistics) are not averaged: each worker keeps its own
        return {"/optimizer"} | {f"/model/{name}" for name, _ in self.model.named_parameters()}

    def state_dict(self) -> dict[str, Any]:
        if self.compressor is None:
            return {}
        own = self.compressor.state_dict() if isinstance(self.compressor, Stateful) else {}
        return {"feedback": self.feedback.state_dict(), "compressor": own}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.compressor is not None and state:
            self.feedback.load_state_dict(state.get("feedback", {}))
            if isinstance(self.compressor, Stateful):
                self.compressor.load_state_dict(state.get("compressor", {}))

    # --- the cost model ---------------------------------------------------------------
    @classmethod
    def advise_specs(cls) -> list[str]:
        # one row per algorithm; an estimated one (native: gloo's ring) is modelled as another;
        # a one-host one (shm) is asked for by name (its ranks must share a host)
        return [
            f"{cls.name}:{a}"
            for a, algo in collectives.ALGORITHMS.items()
            if not algo.estimated and not algo.one_host
        ]

    @classmethod
    def predict(
        cls,
        spec: RunSpec,
        work: costing.Workload,
        nodes: int,
        network: costing.Network,
        calibration: costing.Rates,
    ) -> costing.Prediction:
        """Gradients in fusion buckets, one allreduce each; with overlap the buckets but the
        last hide behind backward (≈ 2/3 of compute). ``compression=`` a cast sends the same
        buckets in its type; a collective compressor (PowerSGD) is its own rounds."""
        cfg = spec.config()
        dp: DataParallelConfig = cfg.section(DataParallelConfig)
        alg, net, cal = cfg.train.algorithm, network, calibration
        if "compression" in spec.settings:
            compressor = parse(cfg.section(CompressionConfig).compression)
            dtype = cast_dtype(compressor)
            if isinstance(compressor, CollectiveCompressor):
                return cls._predict_collective(spec, compressor, work, nodes, net, cal)
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
        total, last, terms, sent, msgs, biggest = _allreduces(
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

    @classmethod
    def _predict_collective(
        cls,
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
        total, _, terms, sent, msgs, biggest = _allreduces(alg, rounds, n, net, cal, 4)
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


def _allreduces(
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
