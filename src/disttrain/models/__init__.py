"""L1: the built-in models (mlp, cnn, gpt) and user factories ``package.module:function``."""

from __future__ import annotations

import importlib

from torch import nn

from disttrain.comm.errors import UsageError
from disttrain.data.datasets import Dataset
from disttrain.models.cnn import cnn
from disttrain.models.gpt import gpt
from disttrain.models.mlp import mlp

__all__ = ["MODELS", "build_model", "cnn", "gpt", "mlp"]

MODELS = ("mlp", "cnn", "gpt")


def _factory(spec: str) -> nn.Module:
    module_name, _, func_name = spec.partition(":")
    if not module_name or not func_name:
        raise UsageError(f"--model {spec!r}: use mlp, cnn, gpt or package.module:function")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the module raising on import
        raise UsageError(f"--model {spec!r}: cannot import {module_name}: {exc}") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise UsageError(f"--model {spec!r}: {module_name} has no function {func_name!r}")
    try:
        model = func()
    except Exception as exc:
        raise UsageError(f"--model {spec!r}: {func_name}() raised {exc!r}") from None
    if not isinstance(model, nn.Module):
        raise UsageError(
            f"--model {spec!r}: {func_name}() returned {type(model).__name__}, not an nn.Module"
        )
    return model


def build_model(name: str, data: Dataset, seq_len: int = 64) -> nn.Module:
    """The model named by ``--model``, shaped for ``data``."""
    if name in ("mlp", "cnn") and data.task != "classification":
        raise UsageError(f"--model {name} classifies; for --dataset {data.name} use --model gpt")
    if name == "mlp":
        return mlp(data.in_features, data.num_classes)
    if name == "cnn":
        return cnn(data.in_features, data.num_classes)
    if name == "gpt":
        if data.task != "lm":
            raise UsageError("--model gpt needs a language-model data set: use --dataset pycode")
        return gpt(vocab=data.num_classes, seq_len=seq_len)
    if ":" in name:
        return _factory(name)
    raise UsageError(f"unknown model {name!r}: use mlp, cnn, gpt or package.module:function")
