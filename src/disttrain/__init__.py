"""disttrain: train PyTorch models with every classic distributed strategy, and measure each."""

import sys
import types
from typing import Any

import disttrain.train as _train_package
from disttrain import elastic
from disttrain.comm.world import (
    cross_rank,
    cross_size,
    init,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from disttrain.dataparallel.broadcast import broadcast_optimizer_state, broadcast_parameters
from disttrain.launch.ray_train import train_loop
from disttrain.ops import allgather, allreduce, allreduce_, broadcast, broadcast_, join
from disttrain.optimizer import DistributedOptimizer
from disttrain.sharded import ShardedOptimizer, shard_model


class _CallableTrainPackage(types.ModuleType):
    """``disttrain.train`` is both the trainer's package and the entry point ``train(config)``.

    A plain function named ``train`` here would hide the package for
    ``import disttrain.train.trainer as t`` and for ``mock.patch("disttrain.train...")``;
    a callable package keeps both working.
    """

    def __call__(self, config: Any = None, **settings: Any) -> dict[str, Any]:
        from disttrain.launch.entry import train as run

        return run(config, **settings)


_train_package.__class__ = _CallableTrainPackage
train = sys.modules["disttrain.train"]  # disttrain.train(config): launch/entry.py

__all__ = [
    "DistributedOptimizer",
    "ShardedOptimizer",
    "allgather",
    "allreduce",
    "allreduce_",
    "broadcast",
    "broadcast_",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "cross_rank",
    "cross_size",
    "elastic",
    "init",
    "join",
    "local_rank",
    "local_size",
    "rank",
    "shard_model",
    "shutdown",
    "size",
    "train",
    "train_loop",
]
__version__ = "0.1.0"
