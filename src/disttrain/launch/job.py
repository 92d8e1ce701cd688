"""``disttrain train`` once its flags are parsed: check, launch the workers, report.

The same entry point serves both sides: in a worker process (started by our
launcher or by ``torchrun``) it trains; otherwise it runs the pre-flight checks,
starts the workers with :func:`disttrain.launch.local.launch` and prints the summary.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sys
from typing import Any

from disttrain.comm.errors import UsageError
from disttrain.launch.preflight import claim_run, preflight
from disttrain.launch.worker import (
    CLAIMED_RUN_ENV,
    as_worker,
    default_out,
    is_worker,
    run_joiner,
    run_worker,
)

__all__ = ["add_arguments", "add_config_flags", "load", "run", "run_job"]


def _title(cls: type[Any]) -> str:
    """A section's group title: its ``TITLE``, else its docstring's first line."""
    doc = (cls.__doc__ or cls.__name__).strip().splitlines()[0].rstrip(".").replace("``", "")
    return str(getattr(cls, "TITLE", "") or doc)


def _help(name: str, f: Any) -> str:
    """The field's help, the choices of the registry its flag names, and its default once."""
    from disttrain.registry import by_flag

    text = f.metadata.get("help", "")
    registry = by_flag("--" + name.replace("_", "-"))
    if registry is not None and registry.names() and not f.metadata.get("choices"):
        text += f"; choices: {', '.join(registry.names())}"
    if "default" in text:  # the help says it in words ("default: a new folder under runs/")
        return text
    if isinstance(f.default, bool):
        return f"{text} (default: {'on' if f.default else 'off'})"
    return f"{text} (default: {f.default!r})" if f.default != "" else text


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Every settings field of every section as a flag, one argument group per section (or
    per ``GROUPS`` title of a section); flags not given stay unset."""
    import disttrain.models
    import disttrain.strategies
    import disttrain.train.optimizers  # noqa: F401
    from disttrain.config import SECTIONS

    parser.argument_default = argparse.SUPPRESS
    groups: dict[str, argparse._ArgumentGroup] = {}
    for cls in SECTIONS:
        sub = {n: t for t, names in getattr(cls, "GROUPS", {}).items() for n in names}
        for f in dataclasses.fields(cls):
            title = sub.get(f.name, _title(cls))
            group = groups.get(title) or groups.setdefault(title, parser.add_argument_group(title))
            flag = "--" + f.name.replace("_", "-")
            if isinstance(f.default, bool):
                group.add_argument(
                    flag, action=argparse.BooleanOptionalAction, help=_help(f.name, f)
                )
            else:
                group.add_argument(
                    flag,
                    type=type(f.default),
                    choices=f.metadata.get("choices"),
                    help=_help(f.name, f),
                )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Train a model with a distributed strategy. --batch-size is the GLOBAL batch."
    )
    parser.argument_default = argparse.SUPPRESS
    parser.usage = "%(prog)s [--config FILE] [--strategy NAME] [options]"  # the groups list them
    parser.add_argument("--config", help="TOML file with the same keys as the flags; flags win")
    add_config_flags(parser)


def run(ns: argparse.Namespace, argv: list[str]) -> int:
    return run_job(load(ns), argv)


def load(ns: argparse.Namespace) -> Any:
    """The run's settings: the flags over ``--config``'s file over the defaults."""
    from disttrain import config

    flags = {k: v for k, v in vars(ns).items() if k not in ("command", "config")}
    return config.load(flags, getattr(ns, "config", None))


def _partial_timeline(path: str, out: str) -> None:
    """After a failed job, merge the parts the ranks that got to the end of train() wrote."""
    from disttrain import timeline

    parts = timeline.parts_folder(out, path)
    if path and os.path.isdir(parts):
        ranks = timeline.merge(parts, path)["ranks"]
        sys.stderr.write(f"disttrain: partial timeline of ranks {ranks} written to {path}\n")


def _check_engine(cfg: Any) -> None:
    """UsageError if ``--launcher ray|slurm`` cannot start this run here."""
    if cfg.train.launcher == "ray":
        from disttrain.launch.ray_train import check_layout

        check_layout(cfg)
    elif cfg.train.launcher == "slurm":
        from disttrain.launch.slurm import check_allocation

        check_allocation(os.environ)


def _run_engine(cfg: Any, argv: list[str], out: str, run_id: str) -> int:
    """``--launcher ray|slurm``: the engine starts the processes (docs/launching.md)."""
    from disttrain.train.progress import print_summary

    if cfg.train.launcher == "slurm":
        from disttrain.launch.slurm import run_slurm

        return run_slurm(cfg, argv, out, run_id)
    from disttrain.launch.ray_train import run_ray

    try:
        summary = run_ray(cfg, out, run_id)
    except UsageError:
        raise
    except Exception as exc:  # Ray's TrainingFailedError and the like: one line
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        sys.stderr.write(f"disttrain: error: the Ray job failed: {text}\n")
        return 1
    print_summary(summary, out)
    return 0


def _stopped_line(sig: int, out: str) -> str:
    """``interrupted at step S; last checkpoint at step C`` (SIGTERM: ``terminated ...``)."""
    from disttrain import checkpoint

    step = 0
    metrics = os.path.join(out, "metrics.jsonl")
    with contextlib.suppress(OSError, ValueError), open(metrics) as fh:
        for line in fh:
            step = max(step, int(json.loads(line).get("step", 0)))
    saved = checkpoint.latest(out)
    kept = f"last checkpoint at step {saved}" if saved else "no checkpoint (--checkpoint-every)"
    verb = "interrupted" if sig == signal.SIGINT else "terminated"
    return f"{verb} at step {step}; {kept}"


def _say(cfg: Any, line: str) -> None:
    """A status line on an interactive terminal: between the command and the first
    progress line (rank 0's bar) the terminal is never silent for long."""
    if cfg.train.progress and sys.stderr.isatty():
        sys.stderr.write(f"disttrain: {line}\n")


def run_job(cfg: Any, argv: list[str]) -> int:
    from disttrain import strategies
    from disttrain.launch import autotable
    from disttrain.launch.local import JobFailed, Stopped, forks_workers, launch, multi_node
    from disttrain.train.progress import print_summary

    """Run ``disttrain train`` with the loaded config ``cfg``; ``argv`` is passed to workers."""
    if cfg.train.join:  # one worker joining a running job (live grow)
        return run_joiner(cfg)
    if is_worker():  # cli.main in a worker (its entry points call run_worker themselves)
        return run_worker(*as_worker(cfg))
    model, data = preflight(cfg)
    nproc = strategies.get(cfg.train.strategy).layout.num_processes(cfg)
    if cfg.train.launcher == "local" and not multi_node(cfg.train):  # all on this host
        from disttrain.launch import memory_plan

        plan = memory_plan.estimate(cfg, model, data, forks_workers(cfg.train))
        memory_plan.check(plan, nproc, memory_plan.available_bytes(), cfg.train.world_size)
    del model, data
    _check_engine(cfg)  # refused before --out is touched, and before anything is said
    cfg, argv = autotable.choose(cfg, argv)  # --algorithm auto: the table, before any start
    _say(cfg, f"starting {nproc} worker process(es) and their rendezvous")
    out = cfg.train.out or default_out(cfg.train.strategy)
    # every worker and restart writes under this run; a Slurm step's agents got theirs
    run_id = os.environ.get(CLAIMED_RUN_ENV) or claim_run(cfg.train, out)
    os.makedirs(out, exist_ok=True)
    if cfg.train.launcher != "local":
        return _run_engine(cfg, argv, out, run_id)
    try:
        launch(cfg.train, nproc, [*argv, "--out", out], run_id)
    except JobFailed as exc:
        _partial_timeline(cfg.train.timeline, out)
        sys.stderr.write(f"disttrain: error: {exc}\n")  # the last line: the root cause
        return 1
    except Stopped as exc:  # Ctrl-C or SIGTERM: one line, the shell's exit code (130, 143)
        sys.stderr.write(f"disttrain: {_stopped_line(exc.signal, out)}\n")
        return exc.code
    path = os.path.join(out, "summary.json")
    if not os.path.exists(path):  # multi-node: global rank 0 ran on another node
        print(f"disttrain: done; rank 0 ran on another node and wrote its summary to its {out}")
        return 0
    with open(path) as fh:
        print_summary(json.load(fh), out)
    return 0
