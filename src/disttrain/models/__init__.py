"""L1: the built-in models (mlp, cnn, gpt; one file each, found by itself) and user
factories ``package.module:function``."""

from __future__ import annotations

import importlib

from torch import nn

from disttrain.comm.errors import UsageError
from disttrain.data.datasets import Dataset
from disttrain.models.base import MODELS
from disttrain.models.cnn import cnn
from disttrain.models.gpt import gpt
from disttrain.models.mlp import mlp
from disttrain.registry import import_submodules

__all__ = ["HELPERS", "MODELS", "build_model", "cnn", "gpt", "mlp"]

#: Modules of this package that are not models.
HELPERS = ("base",)

import_submodules(__name__, skip=HELPERS)


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


def build_model(name: str, data: Dataset) -> nn.Module:
    """The model named by ``--model`` (a registered name or ``package.module:function``),
    shaped for ``data``; an unknown name is the usage error listing the choices."""
    if ":" in name:
        return _factory(name)
    return MODELS.get(name)(data)
