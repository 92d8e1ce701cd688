"""The registry of ``--model`` names; each model's file registers its factory here."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from disttrain.comm.errors import UsageError
from disttrain.data.datasets import Dataset
from disttrain.registry import Registry

__all__ = ["MODELS", "needs_classification"]

#: ``--model`` names: a factory taking the data set the model is shaped for.
MODELS = Registry[Callable[[Dataset], nn.Module]]("model", flag="--model")


def needs_classification(name: str, data: Dataset) -> None:
    if data.task != "classification":
        raise UsageError(f"--model {name} classifies; for --dataset {data.name} use --model gpt")
