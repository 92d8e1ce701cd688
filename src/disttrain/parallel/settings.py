"""Settings of model parallelism (pipeline, tensor, hybrid): flags and TOML keys."""

from __future__ import annotations

from dataclasses import dataclass

from disttrain.comm.errors import UsageError
from disttrain.config import opt, register_section
from disttrain.parallel.placement import Balance, parse_balance

__all__ = ["ParallelConfig"]


@register_section
@dataclass(frozen=True)
class ParallelConfig:
    """--strategy pipeline / tensor / hybrid: how the model is split and scheduled."""

    stages: int = opt(0, "pipeline: stages, one per worker (0: as many as --workers)")
    microbatches: int = opt(4, "pipeline: micro-batches per (per-group) batch")
    schedule: str = opt(
        "gpipe", "pipeline schedule: gpipe, 1f1b, interleaved, zb1, zb2, none (or a plug-in's)"
    )
    virtual_stages: int = opt(2, "pipeline: model chunks per rank (--schedule interleaved)")
    balance: str = opt("params", "pipeline split: params, time, or layers per stage e.g. 2,3,3")
    split_points: str = opt(
        "",
        "pipeline: module paths where stages start, comma-separated "
        "(transformer.h.4,transformer.h.8); instead of --balance",
    )
    recompute: bool = opt(False, "pipeline: recompute activations in backward (less memory)")
    tensor_mode: str = opt(
        "megatron",
        "tensor slicing of an nn.Sequential without a plan: column-then-row pairs, or naive",
        ("megatron", "naive"),
    )
    tp_plan: str = opt(
        "auto",
        "tensor slicing: auto (the model's built-in or declared plan: transformers GPT-2, "
        "Llama ...), or a plan of module paths to styles, a JSON file or object",
    )
    dp: int = opt(0, "hybrid: data-parallel groups (0: workers / pp or tp)")
    pp: int = opt(0, "hybrid: pipeline stages inside each data-parallel group")
    tp: int = opt(0, "hybrid: tensor-parallel ranks inside each data-parallel group")

    def validate(self) -> None:
        for name in ("stages", "dp", "pp", "tp"):
            if getattr(self, name) < 0:
                raise UsageError(f"--{name} must be >= 0, got {getattr(self, name)}")
        if self.microbatches < 1:
            raise UsageError(f"--microbatches must be >= 1, got {self.microbatches}")
        if self.virtual_stages < 1:
            raise UsageError(f"--virtual-stages must be >= 1, got {self.virtual_stages}")
        from disttrain.parallel.pipeline import SCHEDULES

        SCHEDULES.get(self.schedule)  # an unknown name: one line listing the schedules
        if self.pp and self.tp:
            raise UsageError("--pp and --tp are alternatives inside a mesh: set one of them to 0")
        self.balance_spec()
        from disttrain.parallel.plan import parse

        parse(self.tp_plan)  # a missing file or bad JSON: one line

    @property
    def chunks(self) -> int:
        """Model chunks per pipeline rank: ``--virtual-stages`` where the schedule reads it."""
        from disttrain.parallel.pipeline import SCHEDULES

        return self.virtual_stages if SCHEDULES.get(self.schedule).virtual else 1

    @property
    def split_at(self) -> list[str]:
        """``--split-points`` as a list of module paths (empty: none given)."""
        return [p.strip() for p in self.split_points.split(",") if p.strip()]

    def balance_spec(self) -> Balance:
        return parse_balance(self.balance)
