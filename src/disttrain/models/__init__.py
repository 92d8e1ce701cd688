"""L1: the built-in models (mlp, cnn, gpt; one file each, found by itself) and user
factories ``package.module:function``."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from typing import Any

from torch import nn

from disttrain.comm.errors import UsageError
from disttrain.data.datasets import Dataset
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
    lm = data.task == "lm"
    known: dict[str, int | None] = {
        "in_features": data.in_features,
        "num_classes": data.num_classes,
        "vocab": data.num_classes if lm else None,
        "seq_len": int(data.x_train.shape[1]) if lm else None,
    }
    out: dict[str, int] = {}
    for name in FACTORY_ARGUMENTS:
        if name in wanted:
            value = known[name]
            if value is None:
                raise UsageError(
                    f"--model {spec!r}: the factory asks for {name}, which only a language-"
                    f"model data set has (--dataset pycode); {data.name} is a classification set"
                )
            out[name] = value
    return out


def _import_file(spec: str, path: str) -> Any:
    """The module in the file ``path`` (``--model path/to/file.py:function``), loaded once."""
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise UsageError(f"--model {spec!r}: no such file {full}")
    name = "disttrain_model_" + "".join(c if c.isalnum() else "_" for c in full)
    if name in sys.modules:
        return sys.modules[name]
    loader = importlib.util.spec_from_file_location(name, full)
    if loader is None or loader.loader is None:
        raise UsageError(f"--model {spec!r}: cannot load {full} as Python")
    module = importlib.util.module_from_spec(loader)
    sys.modules[name] = module  # as an import would: dataclasses and pickling find it
    try:
        loader.loader.exec_module(module)
    except Exception as exc:  # the module raising on import
        del sys.modules[name]
        raise UsageError(f"--model {spec!r}: cannot import {full}: {exc}") from None
    return module


def _import(spec: str, module_name: str) -> Any:
    """Import ``module_name`` as ``python -m`` would: the current directory first; a path
    to a .py file (``dir/file.py``) is loaded from that file."""
    if module_name.endswith(".py") or os.sep in module_name:
        return _import_file(spec, module_name)
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)  # the console script's sys.path[0] is its bin folder
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name.split(".")[0]:  # the module itself imports a missing one
            raise UsageError(f"--model {spec!r}: cannot import {module_name}: {exc}") from None
        path = os.path.join(cwd, module_name.replace(".", os.sep) + ".py")
        raise UsageError(
            f"--model {spec!r}: cannot import {module_name}: no {path} (run from the folder "
            "that holds it, or add its folder to PYTHONPATH)"
        ) from None
    except Exception as exc:  # the module raising on import
        raise UsageError(f"--model {spec!r}: cannot import {module_name}: {exc}") from None


def _factory(spec: str, data: Dataset) -> nn.Module:
    module_name, _, func_name = spec.partition(":")
    if not module_name or not func_name:
        raise UsageError(
            f"--model {spec!r}: use mlp, cnn, gpt, package.module:function or path/file.py:function"
        )
    module = _import(spec, module_name)
    func = getattr(module, func_name, None)
    if not callable(func):
        raise UsageError(f"--model {spec!r}: {module_name} has no function {func_name!r}")
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
    return MODELS.get(name)(data)
