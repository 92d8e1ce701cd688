"""``disttrain bench NAME``: the benchmarks, each a module with ``add_arguments`` and ``run``."""

from __future__ import annotations

import argparse
import importlib

__all__ = ["BENCHES", "add_arguments", "run"]

#: ``disttrain bench NAME`` -> module with ``add_arguments(parser)`` and ``run(args) -> int``.
BENCHES: dict[str, str] = {
    "allreduce": "disttrain.lab.bench_allreduce",
    "dp": "disttrain.lab.bench_dp",
    "largebatch": "disttrain.lab.bench_largebatch",
    "pipeline": "disttrain.lab.bench_pipeline",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", required=True, parser_class=type(parser))
    for name, module in sorted(BENCHES.items()):
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=(mod.__doc__ or "").strip().splitlines()[0])
        mod.add_arguments(p)
        p.set_defaults(bench_module=module)


def run(ns: argparse.Namespace, argv: list[str]) -> int:
    del argv
    return int(importlib.import_module(ns.bench_module).run(ns))
