"""The ``disttrain`` command: parse, then dispatch to the sub-command's own module.

Every sub-command is a module with ``add_arguments(parser)`` and ``run(ns, argv) -> int``
(:data:`COMMANDS`). Only the chosen sub-command's module is imported, so a worker
process (``disttrain train`` run by the launcher) never imports the lab or the
emulated cluster. Bad input is one line on stderr and exit code 2, before any
worker starts; a failed worker ends the job with exit code 1 and a line naming its rank.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from typing import Any, NoReturn

from disttrain.comm.errors import UsageError
from disttrain.launch import startup, tether
from disttrain.registry import load_plugins

__all__ = [
    "COMMANDS",
    "Parser",
    "build_parser",
    "console",
    "main",
    "trains_as_worker",
    "worker_settings",
]

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
    "run": ("disttrain.horovod.runner", "start N local processes of a Horovod script (horovodrun)"),
}


#: flags that were removed, and what does their job now (a look-alike would mislead:
#: --grad-dtype got "did you mean --outer-dtype?", DiLoCo's own setting)
REMOVED = {"--grad-dtype": "16-bit gradients are --compression fp16 (or bf16)"}


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2 (no usage dump), with the
    one prefix every sub-command uses (``disttrain: error:``); no prefix abbreviations
    (``--epoch 1`` is not ``--epochs``), and a misspelt flag gets "did you mean"."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"disttrain: error: {message}{self._suggestion(message)}\n")
        sys.exit(2)

    def _suggestion(self, message: str) -> str:
        """``; did you mean --epochs?`` for the first unknown flag close to a known one; a
        removed flag names what replaced it (:data:`REMOVED`) instead of a look-alike."""
        if not message.startswith("unrecognized arguments:"):
            return ""
        known = _option_strings(self)
        for word in message.split(":", 1)[1].split():
            if word.split("=")[0] in REMOVED:
                return f"; {word.split('=')[0]} was removed: {REMOVED[word.split('=')[0]]}"
            if word.startswith("--"):
                close = difflib.get_close_matches(word.split("=")[0], known, n=1, cutoff=0.6)
                if close:
                    return f"; did you mean {close[0]}?"
        return ""


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every long flag of ``parser`` and of the sub-command parsers built under it."""
    out: list[str] = []
    for action in parser._actions:
        out += [o for o in action.option_strings if o.startswith("--")]
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += _option_strings(sub)
    return out


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


def _interactive(argv: list[str]) -> bool:
    """A person watches a terminal (a launcher, not one of its workers; no --no-progress):
    status lines then keep it from being silent until the first progress line."""
    from disttrain.launch.worker import is_worker  # torch-free: this runs before torch loads

    return (
        sys.stderr.isatty()
        and "--no-progress" not in argv
        and "-h" not in argv
        and "--help" not in argv
        and not is_worker()
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    tether.tie_to_starter()  # started by compare or a benchmark: end when it does
    chosen = next((a for a in argv if not a.startswith("-")), None)
    if chosen == "train" and _interactive(argv):  # torch loads next: seconds of silence
        sys.stderr.write("disttrain: pre-flight: settings, data set, one batch of the model\n")
    try:
        ns = _parse(argv, chosen)
        module = importlib.import_module(COMMANDS[ns.command][0])
        startup.runs()  # its Ctrl-C handling from here on
        return int(module.run(ns, argv))
    except UsageError as exc:
        _usage_error(exc)
        return 2
    except KeyboardInterrupt:
        from disttrain.launch.env import WORKER_ENV

        if os.environ.get(WORKER_ENV) != "1":  # our launcher says it for its workers, once
            sys.stderr.write("disttrain: interrupted\n")
        return 130


def _parse(argv: list[str], chosen: str | None) -> argparse.Namespace:
    load_plugins()  # before the parser: plug-ins may add settings, strategies, choices
    startup.imports_done()  # torch and every plug-in are in: the collector back on
    return build_parser(chosen if chosen in COMMANDS else None).parse_args(argv)


def _usage_error(exc: UsageError) -> None:
    # the contract is one line; a multi-line text from a library is cut to its first
    sys.stderr.write(f"disttrain: error: {(str(exc).strip().splitlines() or ['?'])[0]}\n")


def trains_as_worker(argv: list[str]) -> bool:
    """``disttrain train`` (not ``--join``) in a worker process: our launcher's or torchrun's.
    Its entry point then calls :func:`~disttrain.launch.worker.run_worker` itself."""
    from disttrain.launch.worker import is_worker  # torch-free: this runs before torch loads

    chosen = next((a for a in argv if not a.startswith("-")), None)
    joins = any(a == "--join" or a.startswith("--join=") for a in argv)
    return chosen == "train" and not joins and is_worker()


def worker_settings(argv: list[str]) -> tuple[Any, bool]:
    """A worker's settings from its command line, read as ``disttrain train`` reads them,
    and whether our launcher started it; bad input leaves with its one line and code 2."""
    from disttrain.launch import job
    from disttrain.launch.worker import as_worker, leave

    startup.begin()  # torch's import next: no collections; a Ctrl-C leaves at once
    tether.tie_to_starter()
    try:
        ns = _parse(argv, "train")
        startup.runs()
        return as_worker(job.load(ns))
    except UsageError as exc:
        _usage_error(exc)
        leave(2)
        raise  # pragma: no cover (leave does not return)


def console() -> NoReturn:
    """The ``disttrain`` command and ``python -m disttrain``: :func:`main`, then leave.

    Until the sub-command runs, a Ctrl-C leaves at once with its one line
    (:mod:`disttrain.launch.startup`). A worker leaves through
    :func:`~disttrain.launch.worker.leave`. A failed job (1) and an interrupted one (130)
    leave at once: the launcher has cleaned up and said why (the interpreter's teardown of
    torch took seconds on a loaded host), and a KeyboardInterrupt caught after torch's
    import could still end the process by SIGINT, CPython's rule for an unhandled one.
    """
    from disttrain.launch.worker import is_worker, leave, run_worker

    startup.begin()  # torch's import next: no collections; a Ctrl-C leaves at once
    if trains_as_worker(sys.argv[1:]):  # one call fewer to the step than through main
        leave(run_worker(*worker_settings(sys.argv[1:])))
    code = main()
    if is_worker():
        leave(code)
    if code in (1, 130):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    console()
