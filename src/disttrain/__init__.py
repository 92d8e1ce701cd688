"""disttrain: train PyTorch models with every classic distributed strategy, and measure each."""

from __future__ import annotations

import importlib
import os
import sys
import types
from typing import TYPE_CHECKING, Any

import disttrain.train as _train_package  # a docstring only: no torch yet


def _is_the_command() -> bool:
    """This process runs the ``disttrain`` command (its script, or ``python -m disttrain``)."""
    argv = getattr(sys, "orig_argv", sys.argv)
    as_module = any(a == "-m" and argv[i + 1 : i + 2] == ["disttrain"] for i, a in enumerate(argv))
    return os.path.basename(sys.argv[0]) == "disttrain" or as_module


if not _is_the_command():
    # a script's process: world.py's early import must come before any process group the
    # script forms, or destroy_process_group() cannot free it (comm/world.py says why)
    import disttrain.comm.world  # noqa: F401

#: each name of the API -> the module that defines it, imported on first use (PEP 562).
#: In the ``disttrain`` command, ``import disttrain`` then costs no torch import, so the
#: command's first second (torch's import) is interruptible: Ctrl-C there reaches
#: cli.main's one line.
_HOME = {
    **dict.fromkeys(
        (
            "cross_rank",
            "cross_size",
            "init",
            "local_rank",
            "local_size",
            "rank",
            "shutdown",
            "size",
        ),
        "disttrain.comm.world",
    ),
    **dict.fromkeys(
        ("broadcast_optimizer_state", "broadcast_parameters"), "disttrain.dataparallel.broadcast"
    ),
    **dict.fromkeys(
        ("allgather", "allreduce", "allreduce_", "broadcast", "broadcast_", "join"), "disttrain.ops"
    ),
    **dict.fromkeys(("ShardedOptimizer", "shard_model"), "disttrain.sharded"),
    "DistributedOptimizer": "disttrain.optimizer",
    **dict.fromkeys(("DistributedRun", "distribute"), "disttrain.api"),
    **dict.fromkeys(
        ("SyncBatchNorm", "convert_sync_batchnorm"), "disttrain.dataparallel.sync_batch_norm"
    ),
    "train_loop": "disttrain.launch.ray_train",
}


def __getattr__(name: str) -> Any:
    if name == "elastic":  # a module of the API, not a name in one
        return importlib.import_module("disttrain.elastic")
    if name not in _HOME:
        raise AttributeError(f"module 'disttrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value  # the next use is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME, "elastic"})


if TYPE_CHECKING:  # the same names, for type checkers and editors
    from disttrain import elastic
    from disttrain.api import DistributedRun, distribute
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
    from disttrain.dataparallel.sync_batch_norm import SyncBatchNorm, convert_sync_batchnorm
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
    "DistributedRun",
    "ShardedOptimizer",
    "SyncBatchNorm",
    "allgather",
    "allreduce",
    "allreduce_",
    "broadcast",
    "broadcast_",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "convert_sync_batchnorm",
    "cross_rank",
    "cross_size",
    "distribute",
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
