"""A scenario: the model, the hardware and the run, as the reader checked them."""

from __future__ import annotations

from dataclasses import dataclass

from disttrain.comm.errors import UsageError
from disttrain.lab.scenario.hardware import IntraLink
from disttrain.lab.scenario.models import ModelShape

__all__ = ["GRAD_BYTES", "PARAM_BYTES", "Hardware", "Measured", "Run", "Scenario", "ScenarioError"]

#: bytes per gradient element on the wire: AMP keeps fp32 master weights, so autocast's
#: gradients are fp32; fp16/bf16 training (Megatron-style) reduces half-precision ones.
GRAD_BYTES = {"fp32": 4, "amp": 4, "fp16": 2, "bf16": 2}
#: bytes per parameter ZeRO-3 gathers, and per activation element tensor/pipeline move
PARAM_BYTES = {"fp32": 4, "amp": 4, "fp16": 2, "bf16": 2}
ACTIVATION_BYTES = {"fp32": 4, "amp": 2, "fp16": 2, "bf16": 2}


class ScenarioError(UsageError):
    """A scenario file's problem: one line, exit code 2."""


@dataclass(frozen=True)
class Hardware:
    gpus_per_node: int
    gpu_samples_per_second: float | None  # one GPU, this model, batch and precision
    gpu_tflops: float | None  # one GPU, Megatron convention (Narayanan et al. eq. 3)
    intra: IntraLink
    inter_bandwidth: float  # bytes/s per node, nominal (0: single node)
    inter_latency: float
    inter_fabric: str
    inter_efficiency: float
    nics_per_node: int


@dataclass(frozen=True)
class Run:
    gpus: int
    batch_per_gpu: int  # micro-batch per forward pass
    accumulation: int  # micro-batches per optimizer step per data-parallel rank
    precision: str
    strategy: str  # as written
    dp: int
    tp: int
    pp: int
    vp: int  # virtual pipeline stages per GPU (interleaved schedule)
    zero: int  # ZeRO stage, 0 for none
    library: str
    overlap: bool  # gradient reduction overlaps backward
    tp_overlap: bool  # tensor-parallel communication overlaps the GEMMs (--tp-comm-overlap)
    bucket_bytes: float

    @property
    def global_batch(self) -> int:
        return self.batch_per_gpu * self.accumulation * self.dp


@dataclass(frozen=True)
class Measured:
    """A run the user timed on this hardware (``[measured]``): the same model, precision
    and batch per GPU at ``run.gpus`` GPUs and ``run.strategy``. The one-GPU rate is the
    one at which the model predicts it exactly."""

    run: Run
    samples_per_second: float


@dataclass(frozen=True)
class Scenario:
    model: ModelShape
    checkpointing: bool
    hardware: Hardware
    run: Run
    measured: Measured | None = None
