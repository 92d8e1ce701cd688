"""Mixed precision: the autocast policy and a dynamic loss scaler whose decisions all ranks share.

Parameters stay fp32 (the master weights); autocast runs matmuls and
convolutions in bf16 or fp16 and keeps reductions such as the loss in fp32.
fp16's narrow range needs loss scaling (Micikevicius et al. 2018): the loss is
multiplied by S before backward so small gradients do not flush to zero, the
gradients are divided by S before the step, and an overflow (Inf/NaN) skips
the step and multiplies S by ``backoff_factor``; after ``growth_interval``
clean steps S grows by ``growth_factor``. The defaults are PyTorch
GradScaler's. The overflow flag is agreed across ranks (a one-element MAX
allreduce), so every rank skips the same steps and keeps the same scale.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain.collectives import all_reduce
from disttrain.comm.errors import DisttrainError

__all__ = ["DTYPES", "LossScaler", "NonFiniteLoss", "autocast", "bf16_cpu_slowdown", "bf16_warning"]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def bf16_warning(slowdown: float) -> str:
    """The pre-flight warning for ``--precision bf16`` on a CPU that emulates bf16; empty
    where bf16 is at most 2x fp32 (native or close)."""
    if slowdown <= 2.0:
        return ""
    cap = torch.backends.cpu.get_cpu_capability()
    return (
        f"disttrain: warning: --precision bf16: this CPU ({cap}) has no native bf16; a bf16 "
        f"matmul took {slowdown:.0f}x the fp32 time here, so training will be many times "
        "slower than --precision fp32 (docs/training.md)"
    )


class NonFiniteLoss(DisttrainError):
    """fp16 training kept overflowing: the run cannot make progress."""


def bf16_cpu_slowdown(size: int = 64, reps: int = 5) -> float:
    """How many times longer a ``size``² bf16 matmul takes than the fp32 one on this CPU.

    About 1 (or less) where the CPU has native bf16 (AVX512-BF16, AMX); 10x and more
    where torch emulates it (AVX2: the conversion costs more than the arithmetic saved).
    Interleaved pairs and the median ratio, so a noisy machine skews both sides alike;
    about a millisecond in all at the default size.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a worker's setting (--threads 1); no thread-pool wake-ups timed
    try:
        a32, b32 = torch.randn(size, size), torch.randn(size, size)
        a16, b16 = a32.bfloat16(), b32.bfloat16()
        a32 @ b32, a16 @ b16  # first calls pick and warm the kernels
        ratios = []
        for _ in range(reps):
            t0 = time.perf_counter()
            a32 @ b32
            t1 = time.perf_counter()
            a16 @ b16
            t2 = time.perf_counter()
            ratios.append((t2 - t1) / max(t1 - t0, 1e-9))
    finally:
        torch.set_num_threads(threads)
    return sorted(ratios)[reps // 2]


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The autocast context for ``precision`` (a no-op for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


class LossScaler:
    """Dynamic loss scaling with agreed overflow decisions; ``state_dict``-able."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        max_skipped_steps: int = 50,
        min_scale: float = 2.0**-24,
    ) -> None:
        self.scale = init_scale
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self.max_skipped_steps = max_skipped_steps
        self.min_scale = min_scale
        self.clean_steps = 0  # consecutive steps without overflow
        self.skipped_in_a_row = 0
        self.skipped_total = 0

    def unscale_(self, params: Iterable[torch.nn.Parameter]) -> bool:
        """Divide every gradient by the scale in place; True if any is Inf or NaN here."""
        found = False
        inv = 1.0 / self.scale
        for p in params:
            if p.grad is not None:
                p.grad.mul_(inv)
                if not found and not bool(torch.isfinite(p.grad).all()):
                    found = True
        return found

    @staticmethod
    def agree(found_inf: bool, group: ProcessGroup | None = None) -> bool:
        """True on every rank if any rank of ``group`` found an overflow."""
        if not dist.is_initialized() or dist.get_world_size(group) == 1:
            return found_inf
        flag = torch.tensor([1.0 if found_inf else 0.0])
        # a sum of non-negative flags is > 0 exactly when some rank overflowed
        all_reduce(flag, "native", group)
        return bool(flag.item() > 0)

    def update(self, found_inf: bool) -> None:
        """Back off after an overflow, grow after ``growth_interval`` clean steps."""
        if found_inf:
            self.scale *= self.backoff_factor
            self.clean_steps = 0
            self.skipped_in_a_row += 1
            self.skipped_total += 1
            if self.skipped_in_a_row >= self.max_skipped_steps or self.scale < self.min_scale:
                raise NonFiniteLoss(
                    f"fp16 gradients overflowed in {self.skipped_in_a_row} steps in a row "
                    f"(loss scale now {self.scale:.3g}): the loss is NaN/Inf at any scale; "
                    "lower --lr, or use --precision bf16"
                )
            return
        self.skipped_in_a_row = 0
        self.clean_steps += 1
        if self.clean_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self.clean_steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "scale": self.scale,
            "clean_steps": self.clean_steps,
            "skipped_in_a_row": self.skipped_in_a_row,
            "skipped_total": self.skipped_total,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.clean_steps = int(state["clean_steps"])
        self.skipped_in_a_row = int(state["skipped_in_a_row"])
        self.skipped_total = int(state["skipped_total"])
        if not math.isfinite(self.scale) or self.scale <= 0:
            raise ValueError(f"invalid loss scale {self.scale} in state")
