"""L0: one small registry type for everything chosen by name (algorithms, strategies,
compressors, models, optimizers), and plug-in discovery.

    ALGORITHMS = Registry[AllReduceAlgorithm]("allreduce algorithm", flag="--algorithm")
    @ALGORITHMS.register("ring")          # or ALGORITHMS.add("ring", obj)
    ALGORITHMS.get("ring")                # unknown name: the usage error listing the choices

An unknown name raises :class:`UsageError` (one line, exit code 2 at the command
line) naming the flag and every valid choice, so no caller re-checks names.

Plug-ins: every module named in ``$DISTTRAIN_PLUGINS`` (comma-separated, importable
from ``sys.path``) is imported once, by :func:`load_plugins`, which the command line calls
first thing (inside its error handling, so a bad plug-in name is one line and exit
code 2), as does every rank the multi-process runner starts. Not when a package is
imported: a plug-in imports the package it extends (``class Ring2(Ring)``), which
must be whole by then. A plug-in registers its algorithm, strategy or compressor exactly as
a built-in file does; every process of a job (workers, benchmark ranks) inherits the
variable, so a plug-in is there wherever the command runs.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from disttrain.comm.errors import UsageError

__all__ = ["PLUGINS_ENV", "Registry", "by_flag", "import_submodules", "load_plugins"]

T = TypeVar("T")

#: Comma-separated module names imported by :func:`load_plugins`.
PLUGINS_ENV = "DISTTRAIN_PLUGINS"

_loaded_plugins: set[str] = set()
_seen_value: str | None = None  # the variable's value when last loaded: skip re-parsing
_BY_FLAG: dict[str, Registry[Any]] = {}


def by_flag(flag: str) -> Registry[Any] | None:
    """The registry whose names the flag ``flag`` chooses from (``--strategy``), if any."""
    return _BY_FLAG.get(flag)


class Registry(Generic[T]):
    """Named entries of one kind, in registration order."""

    def __init__(self, kind: str, flag: str = "") -> None:
        self.kind = kind  # "allreduce algorithm": used in the error message
        self.flag = flag  # "--algorithm": named in the error message when set
        self._entries: dict[str, T] = {}
        if flag:
            _BY_FLAG[flag] = self  # ``train --help`` lists the choices of every such flag

    def add(self, name: str, entry: T) -> T:
        """Register ``entry`` as ``name`` (re-registering a name replaces it)."""
        self._entries[name] = entry
        return entry

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of :meth:`add`."""
        return lambda entry: self.add(name, entry)

    def remove(self, name: str) -> None:
        """Forget ``name`` (tests that register throw-away entries clean up with this)."""
        self._entries.pop(name, None)

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            where = f"{self.flag} {name!r}" if self.flag else repr(name)
            raise UsageError(
                f"{where}: unknown {self.kind}; choose one of {', '.join(self._entries)}"
            ) from None

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def names(self) -> list[str]:
        return list(self._entries)

    def items(self) -> list[tuple[str, T]]:
        return list(self._entries.items())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())


def import_submodules(package: str, skip: tuple[str, ...] = ()) -> None:
    """Import every module of ``package`` (its files register themselves), sorted by name.

    This is what makes "a new algorithm or strategy is one new file" true: no list of
    modules to extend. ``skip`` names the modules that are not entries (``base``, ...).
    """
    pkg = importlib.import_module(package)
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name not in skip and not info.name.startswith("_"):
            importlib.import_module(f"{package}.{info.name}")


def load_plugins() -> None:
    """Import the modules named in ``$DISTTRAIN_PLUGINS`` (once each)."""
    global _seen_value
    value = os.environ.get(PLUGINS_ENV, "")
    if value == _seen_value:
        return
    _seen_value = value
    for name in (n.strip() for n in value.split(",")):
        if name and name not in _loaded_plugins:
            _loaded_plugins.add(name)
            try:
                importlib.import_module(name)
            except Exception as exc:  # ImportError, or the plug-in raising on import
                raise UsageError(f"{PLUGINS_ENV}: cannot import {name}: {exc}") from None
