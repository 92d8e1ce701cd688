"""Tensor slicing: every rank holds a slice of the model's layers (--tp-plan, --tensor-mode).

A model with a plan (``--tp-plan auto``: the built-in or class-declared plan of a
transformers GPT-2 or Llama-family model; or the user's own, a JSON file or object) is
cut as the plan says (:mod:`disttrain.parallel.plan`, :mod:`disttrain.parallel.planned`):
attention by heads, the MLP column- then row-wise. An ``nn.Sequential`` without one is
cut into Megatron pairs (one allreduce per pair of layers, each way) or the seed's naive
vertical split (an all-gather after every layer), ``--tensor-mode``. Every rank sees the
whole batch and ends with the whole output, so every rank computes the same loss and the
replicated layers get the same gradients without any exchange.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn
from torch.distributed import ProcessGroup

from disttrain import collectives
from disttrain.comm.errors import UsageError
from disttrain.comm.world import World
from disttrain.config import RunConfig
from disttrain.parallel import placement, planned, tensor
from disttrain.parallel.plan import Style, resolve
from disttrain.parallel.settings import ParallelConfig
from disttrain.strategies.base import LossFn, Strategy, register
from disttrain.strategies.capabilities import ShardsData
from disttrain.strategies.settings import StrategySettings

__all__ = ["TensorParallel", "TensorSettings", "check_tensor"]


def check_tensor(
    model: nn.Module, size: int, pc: ParallelConfig, size_flag: str, strategy: str = "tensor"
) -> dict[str, Style] | None:
    """UsageError unless ``model`` has a plan that cuts it into ``size`` slices (returned,
    checked), or is an ``nn.Sequential`` with a Linear layer that splits so (None;
    ``strategy``: the one the user named, for the message)."""
    assigned = resolve(model, pc.tp_plan, size, size_flag)
    if assigned is not None:
        if pc.tensor_mode != ParallelConfig.tensor_mode:  # the plan says how each is cut
            raise UsageError(
                f"--tensor-mode {pc.tensor_mode} slices an nn.Sequential without a plan; "
                f"{type(model).__name__} is cut by its plan (--tp-plan {pc.tp_plan}): "
                "drop --tensor-mode"
            )
        return assigned
    if not isinstance(model, nn.Sequential):
        raise UsageError(
            f"--strategy {strategy} cuts a model by a tensor-parallel plan, and "
            f"{type(model).__name__} has none built in or declared: give --tp-plan PATH.json "
            '(module paths to styles, {"layers.*.fc1": "colwise", "layers.*.fc2": "rowwise"}), '
            "or use an nn.Sequential"
        )
    mode = pc.tensor_mode
    layers = placement.check_sequential(model, strategy)
    kinds = tensor.plan(layers, size, mode)
    if size > 1 and all(k == "rep" for k in kinds):
        widths = sorted({m.out_features for m in layers if isinstance(m, nn.Linear)})
        if not widths:
            raise UsageError(
                "--strategy tensor splits top-level nn.Linear layers and this model has none: "
                "use --model mlp"
            )
        if mode == "megatron" and any(w % size == 0 for w in widths):
            raise UsageError(
                f"--tensor-mode megatron slices Linear layers in pairs (one column-wise, the "
                f"next row-wise, only elementwise layers between) and this model has no such "
                f"pair whose inner width splits into {size}: use --tensor-mode naive, or put "
                "two Linear layers in a row"
            )
        raise UsageError(
            f"{size_flag} {size}: no Linear layer's width ({', '.join(map(str, widths))}) "
            f"splits into {size} slices: use a {size_flag} that divides one of them"
        )
    return None


class TensorSettings(StrategySettings):
    """What tensor slicing reads: its mode, and --algorithm (each Megatron pair's allreduce)."""

    main_setting: ClassVar[str | None] = "tensor_mode"
    reads_settings = ("tensor_mode", "tp_plan", "algorithm")

    @classmethod
    def settings_not_read(cls, config: RunConfig) -> dict[str, str]:
        return tensor_settings_not_read(config.section(ParallelConfig))

    @classmethod
    def validate_config(cls, config: RunConfig, model: nn.Module) -> None:
        pc: ParallelConfig = config.section(ParallelConfig)
        check_tensor(model, config.train.world_size, pc, "--workers")


def tensor_settings_not_read(pc: ParallelConfig) -> dict[str, str]:
    """--tensor-mode cuts a Sequential without a plan: a plan of the user's replaces it."""
    if pc.tp_plan == "auto":
        return {}
    return {"tensor_mode": "with --tp-plan (the plan says how each layer is cut)"}


# ShardsData: every rank sees the whole batch (one data shard).
@register(
    settings=TensorSettings,
    cost="disttrain.strategies.cost.tensor:TensorCost",
    shares_activations=True,  # slices exchange activations
)
class TensorParallel(Strategy, ShardsData):
    """Rank r of T holds slice r of every splittable Linear layer."""

    name = "tensor"

    def __init__(self, config: RunConfig, world: World, loss_fn: LossFn) -> None:
        super().__init__(config, world, loss_fn)
        self.pc: ParallelConfig = config.section(ParallelConfig)
        self.bind(None, list(range(world.world_size)))

    def bind(self, group: ProcessGroup | None, ranks: list[int]) -> None:
        """Slice the model across global ``ranks`` (``group``)."""
        self.group = group
        self.size = len(ranks)
        self.shard = ranks.index(self.world.rank)

    @property
    def data_rank(self) -> int:
        return 0

    @property
    def data_world_size(self) -> int:
        return 1  # every shard sees the whole batch

    def prepare_model(self, model: nn.Module, sample: torch.Tensor) -> nn.Module:
        self.full = model if self.shard == 0 else None
        algorithm = collectives.build(self.config.train.algorithm, self.config)
        self.plan: dict[str, Style] | None = resolve(model, self.pc.tp_plan, self.size, "--tp")
        if self.plan is not None:
            return planned.shard(model, self.plan, self.shard, self.size, self.group, algorithm)
        placement.check_sequential(model, self.name)
        assert isinstance(model, nn.Sequential)
        sharded, self.kinds = tensor.shard_model(
            model, self.shard, self.size, self.group, self.pc.tensor_mode, algorithm
        )
        return sharded

    def eval_model(self) -> nn.Module | None:
        if self.plan is not None:
            planned.gather(self.full, self.model, self.group)
        else:
            tensor.gather_into(self.full, self.model, self.kinds, self.group)  # type: ignore[arg-type]
        return self.full if self.world.rank == 0 else None

    def summary(self) -> dict[str, Any]:
        if self.plan is not None:
            styles = {path: s.name for path, s in self.plan.items()}
            return {"tensor": {"size": self.size, "plan": styles}}
        return {"tensor": {"mode": self.pc.tensor_mode, "size": self.size, "layers": self.kinds}}

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return super().forward_backward(x, y)
