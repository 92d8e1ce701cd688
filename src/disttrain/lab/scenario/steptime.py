"""One optimizer step's time for a scenario, and what it is made of.

    step = compute of m micro-batches (+ tensor-parallel allreduces + pipeline sends)
         + the pipeline bubble
         + data-parallel communication that backward does not hide
         + synchronisation (waiting for the slowest of p GPUs)

Compute comes from the one-GPU rate: ``gpu_samples_per_second`` at this batch, or
``gpu_tflops`` in Megatron's convention (the FLOPs of Narayanan et al. 2021, eq. 3,
recomputation counted). Backward is 2/3 of a step's compute (3/4 with recomputation,
which re-runs the forward inside it), spread over the layers by their FLOPs. A stage of
a tp x pp split runs 1/(tp*pp) of the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from disttrain.lab.scenario import collectives as coll
from disttrain.lab.scenario.hardware import FABRICS, inter_node
from disttrain.lab.scenario.models import ModelShape, boundary_outputs, megatron_flops_per_sample
from disttrain.lab.scenario.spec import ACTIVATION_BYTES, GRAD_BYTES, PARAM_BYTES, Scenario

__all__ = ["SYNC_PER_DOUBLING", "Prediction", "predict"]

#: Every step ends in a collective, which waits for the slowest GPU; the expected maximum
#: of p step times grows with log p. This is the share of compute lost per doubling of p,
#: chosen on calibration rows of benchmarks/published/measurements.toml: 8 GPUs of
#: dle-pt-rn50-dgx1-fp32-8gpu and dle-pt-rn50-dgxa100-tf32-8gpu lose ~3 % (3 doublings)
#: with their communication hidden.
SYNC_PER_DOUBLING = 0.01


@dataclass(frozen=True)
class Prediction:
    samples_per_second: float
    scaling_efficiency: float
    step_seconds: float
    breakdown: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "samples_per_second": self.samples_per_second,
            "scaling_efficiency": self.scaling_efficiency,
            "step_seconds": self.step_seconds,
            "breakdown": self.breakdown,
        }


def microbatch_seconds(sc: Scenario) -> float:
    """One micro-batch's forward and backward of the whole model on one GPU."""
    hw, b = sc.hardware, sc.run.batch_per_gpu
    if hw.gpu_samples_per_second is not None:
        return b / hw.gpu_samples_per_second
    assert hw.gpu_tflops is not None
    return b * megatron_flops_per_sample(sc.model, sc.checkpointing) / (hw.gpu_tflops * 1e12)


def _net(sc: Scenario) -> tuple[float, float, float]:
    """(achieved bytes/s per node, latency, one collective's cap): hardware.inter_node."""
    hw = sc.hardware
    if hw.inter_bandwidth <= 0 or hw.inter_fabric not in FABRICS:
        return hw.inter_bandwidth * hw.inter_efficiency, hw.inter_latency, math.inf
    achieved, cap = inter_node(
        hw.inter_fabric, hw.inter_bandwidth, hw.nics_per_node, hw.gpus_per_node
    )
    return achieved, hw.inter_latency, cap


def _group(sc: Scenario, ranks: int, per_node: int, sharing: int) -> coll.Group:
    hw = sc.hardware
    bw, lat, cap = _net(sc)
    return coll.Group(
        ranks=ranks,
        per_node=per_node,
        intra_bandwidth=hw.intra.bandwidth,
        intra_latency=hw.intra.latency,
        net_bandwidth=bw,
        net_latency=lat,
        sharing=sharing,
        net_cap=cap,
        plateau=hw.intra.ring_plateau,
    )


def dp_group(sc: Scenario) -> coll.Group:
    """The data-parallel group; ranks are laid out tensor-fastest, then data, then
    pipeline (Megatron's order), so a node holds G/tp ranks of one group when tp < G."""
    r, g = sc.run, sc.hardware.gpus_per_node
    per_node = max(1, min(r.dp, g // r.tp)) if r.tp < g else 1
    return _group(sc, r.dp, per_node, max(1, min(g, r.gpus) // per_node))


def _tensor_seconds(sc: Scenario) -> float:
    """Per micro-batch per stage: Megatron's 2 allreduces of the b*s*h activations in each
    layer's forward and 2 in its backward (2 more when recomputing), on the critical path."""
    r, m = sc.run, sc.model
    if r.tp == 1:
        return 0.0
    g = sc.hardware.gpus_per_node
    group = _group(sc, r.tp, min(r.tp, g), max(1, g // r.tp) if r.tp > g else 1)
    size = r.batch_per_gpu * m.seq_len * m.hidden * ACTIVATION_BYTES[r.precision]
    per_layer = (6 if sc.checkpointing else 4) * coll.allreduce(size, group, r.library)[0]
    return per_layer * m.blocks / r.pp


def _p2p_seconds(sc: Scenario) -> float:
    """Per micro-batch per stage: the activations forward and their gradient back, once per
    virtual stage; across nodes when a stage fills a node (tp * dp >= G), over one NIC.
    Each of a stage's tp ranks sends 1/tp of the activations (Megatron's scatter/gather,
    Narayanan et al. 2021 section 4.1)."""
    r, m, hw = sc.run, sc.model, sc.hardware
    if r.pp == 1:
        return 0.0
    width = m.hidden * m.seq_len if m.transformer else boundary_outputs(m, r.pp)
    size = r.batch_per_gpu * width * ACTIVATION_BYTES[r.precision] / r.tp
    if r.tp * r.dp >= hw.gpus_per_node and hw.inter_bandwidth > 0:
        bw, lat, cap = _net(sc)
        nics = max(1, hw.nics_per_node)
        bw = min(bw / nics, bw / hw.gpus_per_node * nics, cap / nics)
    else:
        bw, lat = hw.intra.bandwidth, hw.intra.latency
    return 2 * r.vp * coll.p2p(size, bw, lat)


def _buckets(sc: Scenario, scale: float) -> list[tuple[float, float]]:
    """(ready time in backward, bytes) per gradient bucket: the layers in reverse, each
    done when backward has spent its FLOPs' share; a bucket goes when it is full."""
    m, r = sc.model, sc.run
    out: list[tuple[float, float]] = []
    done, fill, total = 0.0, 0.0, m.flops or 1.0
    for layer in reversed(m.layers):
        done += layer.flops / total
        fill += layer.params * scale * GRAD_BYTES[r.precision]
        if fill >= r.bucket_bytes:
            out.append((done, fill))
            fill = 0.0
    if fill > 0:
        out.append((1.0, fill))
    return out


def _allreduce_exposed(sc: Scenario, backward: float) -> tuple[float, float, str]:
    """(exposed seconds, total seconds, algorithm) of the bucketed gradient allreduce: the
    buckets go in order, each when ready and the previous is done; what runs past the
    last micro-batch's backward is exposed (all of it without overlap)."""
    r = sc.run
    group = dp_group(sc)
    scale = 1.0 / (r.tp * r.pp)
    end, total, algo = 0.0, 0.0, "ring"
    for ready, size in _buckets(sc, scale):
        t, algo = coll.allreduce(size, group, r.library)
        total += t
        end = max(end, ready * backward) + t
    if r.zero in (1, 2):  # reduce-scatter in the buckets' place, then the all-gather after
        end, total = end / 2, total / 2
        gather = coll.allgather(sc.model.params * scale * PARAM_BYTES[r.precision], group)
        return max(0.0, end - backward) + gather, total + gather, algo
    exposed = max(0.0, end - backward) if r.overlap else total
    return exposed, total, algo


def _zero3_exposed(sc: Scenario, compute: float, fwd_share: float) -> tuple[float, float]:
    """ZeRO-3: each layer's parameters all-gathered before its forward and again before its
    backward, its gradients reduce-scattered after; prefetching overlaps a layer's
    communication with its compute, so only the excess shows. Every micro-batch."""
    r, m = sc.run, sc.model
    group = dp_group(sc)
    exposed = total = 0.0
    flops = m.flops or 1.0
    for layer in m.layers:
        share = compute * layer.flops / flops
        gather = coll.allgather(layer.params * PARAM_BYTES[r.precision], group)
        scatter = coll.allgather(layer.params * GRAD_BYTES[r.precision], group)
        exposed += max(0.0, gather - share * fwd_share)
        exposed += max(0.0, gather + scatter - share * (1 - fwd_share))
        total += 2 * gather + scatter
    return exposed * r.accumulation, total * r.accumulation


def predict(sc: Scenario) -> Prediction:
    r = sc.run
    full = microbatch_seconds(sc)
    fwd_share = 0.25 if sc.checkpointing else 1 / 3
    stage = full / (r.tp * r.pp)
    tensor, p2p = _tensor_seconds(sc), _p2p_seconds(sc)
    if r.tp_overlap:  # split GEMMs hide the allreduces; only what outlasts them shows
        tensor = max(0.0, tensor - stage)
    per_mb = stage + tensor + p2p
    bubble = (r.pp - 1) / r.vp * per_mb
    compute = r.accumulation * per_mb
    if r.zero == 3:
        exposed, dp_total = _zero3_exposed(sc, stage, fwd_share)
        algo = "ring"
    else:
        exposed, dp_total, algo = _allreduce_exposed(sc, stage * (1 - fwd_share))
    sync = SYNC_PER_DOUBLING * math.log2(max(1, r.gpus)) * (compute + bubble)
    step = compute + bubble + exposed + sync
    samples = r.global_batch / step
    one_gpu = r.batch_per_gpu / full
    flops = megatron_flops_per_sample(sc.model, sc.checkpointing)
    breakdown = {
        "layout": {"dp": r.dp, "tp": r.tp, "pp": r.pp, "vp": r.vp, "zero": r.zero},
        "micro_batches": r.accumulation,
        "batch_per_gpu": r.batch_per_gpu,
        "global_batch": r.global_batch,
        "compute_seconds": r.accumulation * stage,
        "tensor_parallel_seconds": r.accumulation * tensor,
        "pipeline_p2p_seconds": r.accumulation * p2p,
        "pipeline_bubble_seconds": bubble,
        "data_parallel_seconds": dp_total,
        "data_parallel_exposed_seconds": exposed,
        "sync_seconds": sync,
        "allreduce_algorithm": algo,
        "model_params": sc.model.params,
        "gpu_samples_per_second": one_gpu,  # the one-GPU rate the prediction stands on
        "model_tflops_per_gpu": flops * samples / r.gpus / 1e12,
    }
    return Prediction(samples, samples / (r.gpus * one_gpu), step, breakdown)


def describe(model: ModelShape) -> str:
    return f"{model.name}: {model.params / 1e6:,.1f}M parameters ({model.source})"
