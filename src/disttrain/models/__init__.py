"""L1: the built-in models (mlp, cnn, gpt; one file each, found by itself) and user
factories ``package.module:function``."""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from disttrain.comm.errors import UsageError
from disttrain.data.datasets import Dataset
from disttrain.data.user import UserData
from disttrain.factories import load_callable
from disttrain.models.base import MODELS
from disttrain.models.cnn import cnn
from disttrain.models.gpt import gpt
from disttrain.models.mlp import mlp
from disttrain.registry import import_submodules

__all__ = ["FACTORY_ARGUMENTS", "HELPERS", "MODELS", "build_model", "cnn", "gpt", "mlp"]

#: Modules of this package that are not models.
HELPERS = ("base",)

import_submodules(__name__, skip=HELPERS)


#: What a user's factory may ask for by parameter name, from the data set.
FACTORY_ARGUMENTS = ("in_features", "num_classes", "vocab", "seq_len")


def _factory_kwargs(spec: str, func: Any, data: Dataset) -> dict[str, int]:
    """The keyword arguments ``func``'s signature asks for among :data:`FACTORY_ARGUMENTS`."""
    try:
        wanted = set(inspect.signature(func).parameters)
    except (TypeError, ValueError):  # a builtin or C callable: call it bare
        return {}
    lm, user = data.task == "lm", data.task == "user"
    known: dict[str, int | None] = {
        "in_features": data.in_features if "in_features" in wanted else None,
        "num_classes": data.num_classes,
        "vocab": data.num_classes if lm else None,
        "seq_len": int(data.x_train.shape[1]) if lm else None,
    }
    out: dict[str, int] = {}
    for name in FACTORY_ARGUMENTS:
        if name in wanted:
            value = known[name]
            if value is None and user and name != "in_features":
                raise UsageError(
                    f"--model {spec!r}: the factory asks for {name}, which a user's data set "
                    f"({data.name}) does not tell: give it a default"
                )
            if value is None:
                raise UsageError(
                    f"--model {spec!r}: the factory asks for {name}, which only a language-"
                    f"model data set has (--dataset pycode); {data.name} is a classification set"
                )
            out[name] = value
    return out


def _factory(spec: str, data: Dataset) -> nn.Module:
    func = load_callable(spec, "--model", "mlp, cnn, gpt")
    func_name = spec.partition(":")[2]
    kwargs = _factory_kwargs(spec, func, data)
    try:
        model = func(**kwargs)
    except Exception as exc:
        raise UsageError(f"--model {spec!r}: {func_name}() raised {exc!r}") from None
    if not isinstance(model, nn.Module):
        raise UsageError(
            f"--model {spec!r}: {func_name}() returned {type(model).__name__}, not an nn.Module"
        )
    return model


def build_model(name: str, data: Dataset) -> nn.Module:
    """The model named by ``--model`` (a registered name, ``package.module:function`` or
    ``path/file.py:function``), shaped for ``data``; an unknown name is the usage error
    listing the choices.

    A factory is imported from the current directory first (as ``python -m`` does) and
    may take any of ``in_features``, ``num_classes`` (and, for language data, ``vocab``
    and ``seq_len``) by name: those its signature asks for are passed."""
    if ":" in name:
        return _factory(name, data)
    kind = MODELS.get(name)
    if isinstance(data, UserData):  # a user's data set: the model is theirs too
        raise UsageError(
            f"--model {name} is shaped for the built-in data sets; with --dataset "
            f"{data.name} give --model module:function returning your nn.Module"
        )
    return kind(data)
