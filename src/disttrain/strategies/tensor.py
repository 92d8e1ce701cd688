"""Tensor slicing: every rank holds a slice of each Linear layer's neurons (``--tensor-mode``).

Megatron pairs (one allreduce per pair of layers, each way) or the seed's
naive vertical split (an all-gather after every layer). Every rank sees the
whole batch and ends with the whole output, so every rank computes the same
loss and the replicated layers get the same gradients without any exchange.
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
from disttrain.parallel import placement, tensor
from disttrain.parallel.settings import ParallelConfig
from disttrain.strategies.base import LossFn, Strategy, register
from disttrain.strategies.capabilities import ShardsData
from disttrain.strategies.settings import StrategySettings

__all__ = ["TensorParallel", "TensorSettings", "check_tensor"]


def check_tensor(
    model: nn.Module, size: int, mode: str, size_flag: str, strategy: str = "tensor"
) -> None:
    """UsageError unless ``model`` has a Linear layer that splits into ``size`` slices
    (``strategy``: the one the user named, for the message)."""
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


class TensorSettings(StrategySettings):
    """What tensor slicing reads: its mode, and --algorithm (each Megatron pair's allreduce)."""

    main_setting: ClassVar[str | None] = "tensor_mode"
    reads_settings = ("tensor_mode", "algorithm")

    @classmethod
    def validate_config(cls, config: RunConfig, model: nn.Module) -> None:
        pc: ParallelConfig = config.section(ParallelConfig)
        check_tensor(model, config.train.world_size, pc.tensor_mode, "--workers")


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
        placement.check_sequential(model, self.name)
        assert isinstance(model, nn.Sequential)
        self.full = model if self.shard == 0 else None
        sharded, self.kinds = tensor.shard_model(
            model,
            self.shard,
            self.size,
            self.group,
            self.pc.tensor_mode,
            collectives.build(self.config.train.algorithm, self.config),
        )
        return sharded

    def eval_model(self) -> nn.Module | None:
        tensor.gather_into(self.full, self.model, self.kinds, self.group)  # type: ignore[arg-type]
        return self.full if self.world.rank == 0 else None

    def summary(self) -> dict[str, Any]:
        return {"tensor": {"mode": self.pc.tensor_mode, "size": self.size, "layers": self.kinds}}

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return super().forward_backward(x, y)
