"""The ``disttrain`` command: parse, then dispatch to the sub-command's own module.

Every sub-command is a module with ``add_arguments(parser)`` and ``run(ns, argv) -> int``
(:data:`COMMANDS`). Only the chosen sub-command's module is imported, so a worker
process (``disttrain train`` run by the launcher) never imports the lab or the
emulated cluster. Bad input is one line on stderr and exit code 2, before any
worker starts; a failed worker ends the job with exit code 1 and a line naming its rank.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

from disttrain.comm.errors import UsageError
from disttrain.registry import load_plugins

__all__ = ["COMMANDS", "Parser", "build_parser", "main"]

#: sub-command -> (module with ``add_arguments`` and ``run``, one-line help).
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("disttrain.launch.job", "train a model on N workers"),
    "bench": ("disttrain.lab.bench", "benchmarks against the anchors"),
    "compare": (
        "disttrain.lab.compare",
        "run the same workload under several strategies and write a report",
    ),
    "advise": ("disttrain.lab.advise", "rank strategies by a calibrated cost model"),
    "cluster": ("disttrain.cluster.command", "an emulated multi-host cluster (needs root)"),
}


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2 (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``only``, just that sub-command gets its flags (imported)."""
    parser = Parser(
        prog="disttrain", description="Distributed training with every classic strategy, measured."
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if only in (None, name):
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    try:
        load_plugins()  # before the parser: plug-ins may add settings, strategies, choices
        parser = build_parser(chosen if chosen in COMMANDS else None)
        ns = parser.parse_args(argv)
        module = importlib.import_module(COMMANDS[ns.command][0])
        return int(module.run(ns, argv))
    except UsageError as exc:
        # the contract is one line; a multi-line text from a library is cut to its first
        sys.stderr.write(f"disttrain: error: {(str(exc).strip().splitlines() or ['?'])[0]}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("disttrain: interrupted\n")
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
