"""``disttrain bench NAME``: the benchmarks, each a module with ``add_arguments`` and ``run``.

Every module of this package is a benchmark named after its file (``_`` → ``-``),
found by itself: adding a benchmark is adding one file here.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil

__all__ = ["add_arguments", "benches", "run"]


def benches() -> dict[str, str]:
    """Every benchmark: each module of this package (``_name`` modules are helpers)."""
    found: dict[str, str] = {}
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            found[info.name.replace("_", "-")] = f"{__name__}.{info.name}"
    return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", required=True, parser_class=type(parser))
    for name, module in sorted(benches().items()):
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=(mod.__doc__ or "").strip().splitlines()[0])
        mod.add_arguments(p)
        p.set_defaults(bench_module=module)


def run(ns: argparse.Namespace, argv: list[str]) -> int:
    del argv
    return int(importlib.import_module(ns.bench_module).run(ns))
