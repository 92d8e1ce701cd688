"""A user's object by name: ``package.module:function`` or ``path/file.py:function``.

``--model``, ``--dataset``, ``--loss`` and ``--metric`` name a function of the user's; it
is imported as ``python -m`` would (the current directory first), or loaded from the
file. Every failure is one line naming the flag and the spec.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

from disttrain.comm.errors import UsageError

__all__ = ["is_spec", "load_callable"]


def is_spec(value: str) -> bool:
    """``value`` names a function (``module:function``), not a built-in by name."""
    return ":" in value


def load_callable(spec: str, flag: str, builtins: str) -> Callable[..., Any]:
    """The function ``spec`` names (one line naming ``flag`` if it cannot be had);
    ``builtins``: the flag's own names, for the message."""
    if not isinstance(spec, str):
        raise UsageError(
            f"{flag}: expected a name or 'module:function', got a {type(spec).__name__}"
        )
    module_name, _, func_name = spec.partition(":")
    if not module_name or not func_name:
        raise UsageError(
            f"{flag} {spec!r}: use {builtins}, package.module:function or path/file.py:function"
        )
    module = _import(spec, module_name, flag)
    func = getattr(module, func_name, None)
    if not callable(func):
        raise UsageError(f"{flag} {spec!r}: {module_name} has no function {func_name!r}")
    return func


def _import_file(spec: str, path: str, flag: str) -> Any:
    """The module in the file ``path`` (``--model path/to/file.py:function``), loaded once."""
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise UsageError(f"{flag} {spec!r}: no such file {full}")
    name = "disttrain_model_" + "".join(c if c.isalnum() else "_" for c in full)
    if name in sys.modules:
        return sys.modules[name]
    loader = importlib.util.spec_from_file_location(name, full)
    if loader is None or loader.loader is None:
        raise UsageError(f"{flag} {spec!r}: cannot load {full} as Python")
    module = importlib.util.module_from_spec(loader)
    sys.modules[name] = module  # as an import would: dataclasses and pickling find it
    try:
        loader.loader.exec_module(module)
    except Exception as exc:  # the module raising on import
        del sys.modules[name]
        raise UsageError(f"{flag} {spec!r}: cannot import {full}: {exc}") from None
    return module


def _import(spec: str, module_name: str, flag: str) -> Any:
    """Import ``module_name`` as ``python -m`` would: the current directory first; a path
    to a .py file (``dir/file.py``) is loaded from that file."""
    if module_name.endswith(".py") or os.sep in module_name:
        return _import_file(spec, module_name, flag)
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)  # the console script's sys.path[0] is its bin folder
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name.split(".")[0]:  # the module itself imports a missing one
            raise UsageError(f"{flag} {spec!r}: cannot import {module_name}: {exc}") from None
        path = os.path.join(cwd, module_name.replace(".", os.sep) + ".py")
        raise UsageError(
            f"{flag} {spec!r}: cannot import {module_name}: no {path} (run from the folder "
            "that holds it, or add its folder to PYTHONPATH)"
        ) from None
    except Exception as exc:  # the module raising on import
        raise UsageError(f"{flag} {spec!r}: cannot import {module_name}: {exc}") from None
