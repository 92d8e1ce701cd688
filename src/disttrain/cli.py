"""The ``disttrain`` command: ``train``, ``bench``, ``compare``, ``advise`` and ``cluster``.

Bad input is reported as one line on stderr with exit code 2, before any
worker starts. A failed worker ends the job with exit code 1 and a line that
names its rank.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import re
import sys
import time
from typing import Any, NoReturn

from disttrain.comm.errors import UsageError

__all__ = ["BENCHES", "main"]

#: ``disttrain bench NAME`` -> module with ``add_arguments(parser)`` and ``run(args) -> int``.
BENCHES: dict[str, str] = {
    "allreduce": "disttrain.lab.bench_allreduce",
    "dp": "disttrain.lab.bench_dp",
    "largebatch": "disttrain.lab.bench_largebatch",
    "pipeline": "disttrain.lab.bench_pipeline",
}


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2 (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    import disttrain.strategies  # noqa: F401  (strategies register their settings sections)
    from disttrain.config import section_fields

    for name, (_, f) in section_fields().items():
        flag = "--" + name.replace("_", "-")
        kind = type(f.default)
        help_text = f.metadata.get("help", "")
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
        else:
            choices = f.metadata.get("choices")
            parser.add_argument(
                flag, type=kind, choices=choices, help=f"{help_text} (default: {f.default!r})"
            )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="disttrain", description="Distributed training with every classic strategy, measured."
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    train = sub.add_parser(
        "train",
        help="train a model on N workers",
        argument_default=argparse.SUPPRESS,
        description="Train a model with a distributed strategy. --batch-size is the GLOBAL batch.",
    )
    train.add_argument("--config", help="TOML file with the same keys as the flags; flags win")
    _add_config_flags(train)
    bench = sub.add_parser("bench", help="benchmarks against the anchors")
    bench_sub = bench.add_subparsers(dest="bench", required=True, parser_class=_Parser)
    for name, module in sorted(BENCHES.items()):
        mod = importlib.import_module(module)
        p = bench_sub.add_parser(name, help=(mod.__doc__ or "").strip().splitlines()[0])
        mod.add_arguments(p)
        p.set_defaults(bench_module=module)
    from disttrain.launch import cluster

    cluster.add_arguments(sub.add_parser("cluster", help="an emulated multi-host cluster"), _Parser)
    from disttrain.lab import advise

    advise.add_arguments(
        sub.add_parser("advise", help="rank strategies by a calibrated cost model")
    )
    from disttrain.lab import compare

    compare_parser = sub.add_parser(
        "compare",
        help="run the same workload under several strategies and write a report",
        argument_default=argparse.SUPPRESS,
        description="Train the same workload under each of --strategies; write DIR/report.md "
        "and report.html (see docs/lab.md). Train flags given here go to every run.",
    )
    _add_config_flags(compare_parser)
    compare.add_arguments(compare_parser)
    return parser


def _is_worker() -> bool:
    """True inside a worker process: started by our launcher, or by ``torchrun``."""
    from disttrain.launch.local import WORKER_ENV

    return os.environ.get(WORKER_ENV) == "1" or (
        "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ
    )


def _preflight(cfg: Any) -> None:
    """Check everything that can be checked before a worker starts (exit 2 on failure)."""
    from disttrain import collectives, strategies
    from disttrain.data import load_dataset
    from disttrain.models import build_model
    from disttrain.train.faults import parse_fault

    tc = cfg.train
    if tc.strategy not in strategies.STRATEGIES:
        raise UsageError(
            f"unknown strategy {tc.strategy!r}: "
            f"choose one of {', '.join(sorted(strategies.STRATEGIES))}"
        )
    if tc.algorithm not in collectives.ALGORITHMS:
        raise UsageError(
            f"unknown algorithm {tc.algorithm!r}: choose one of {', '.join(collectives.ALGORITHMS)}"
        )
    fault = parse_fault(tc.inject_fault)
    if fault and fault.rank >= tc.world_size:
        raise UsageError(
            f"--inject-fault names rank {fault.rank}, but there are {tc.world_size} workers"
        )
    if tc.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is available on this machine")
    data = load_dataset(
        tc.dataset,
        tc.synthetic_size,
        tc.synthetic_dim,
        tc.synthetic_classes,
        tc.seq_len,
        tc.pycode_chars,
    )
    if len(data.x_train) < tc.batch_size:
        raise UsageError(
            f"--batch-size {tc.batch_size} is larger than the {len(data.x_train)} training samples"
        )
    model = build_model(tc.model, data, tc.seq_len)
    # Strategies check what needs the whole config (pipeline stages, mesh, ps modes) here.
    strategies.get(tc.strategy).validate_config(cfg, model)
    if tc.resume:
        from disttrain.train import checkpoint

        checkpoint.load(tc.resume, 0, tc.world_size)  # ours, complete, same number of workers


def _default_out(strategy: str) -> str:
    return os.path.join("runs", f"{time.strftime('%Y%m%d-%H%M%S')}-{strategy}-{os.getpid()}")


def _torchrun_default_out(strategy: str) -> str:
    """The folder every rank of one ``torchrun`` job agrees on when ``--out`` is not given.

    Ranks start at different instants in different processes, so a time stamp
    or pid would give each its own folder (and checkpoints, timeline parts and
    roll-call files would scatter). The rendezvous id names the job: ``torchrun
    --standalone`` draws a fresh one per job; a fixed ``--rdzv-id`` reuses it.
    """
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    return os.path.join("runs", f"torchrun-{run_id}-{strategy}")


# gloo's words for a peer that died or stopped answering
_PEER_ERROR = re.compile(r"peer|timed out|timeout|connection (reset|closed|refused)", re.I)


def _one_line(exc: BaseException) -> str:
    """The gist of an error: its first line, without gloo's source path and advice."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)  # "[.../pair.cc:537] "
    return text.split(". This is typically")[0]


def _run_worker(cfg: Any, launched_by_us: bool) -> int:
    from disttrain import strategies
    from disttrain.launch.supervise import run_supervised

    rank = int(os.environ.get("RANK", "0"))
    if strategies.get(cfg.train.strategy).survives_loss_of(cfg, rank):
        return run_supervised(lambda: _train_worker(cfg, launched_by_us), rank)
    return _train_worker(cfg, launched_by_us)


def _train_worker(cfg: Any, launched_by_us: bool) -> int:
    from disttrain.comm import world
    from disttrain.comm.errors import PeerFailure
    from disttrain.launch import rollcall
    from disttrain.launch.local import PEER_EXIT_CODE
    from disttrain.train.progress import print_summary
    from disttrain.train.trainer import train

    try:
        summary = train(cfg)
    except Exception as exc:
        import torch.distributed as dist

        if os.environ.get("DISTTRAIN_DEBUG"):
            raise
        rank = os.environ.get("RANK", "0")
        text = _one_line(exc)
        if isinstance(exc, (dist.DistError, PeerFailure)) or _PEER_ERROR.search(text):
            sys.stderr.write(f"disttrain: rank {rank} stopped: a peer failed ({text})\n")
            # answer the launcher's roll call, so that a peer that hung can be named
            named = exc.rank if isinstance(exc, PeerFailure) else None
            rollcall.answer(int(rank), cfg.train.world_size, cfg.train.timeout, named)
            return PEER_EXIT_CODE
        sys.stderr.write(f"disttrain: rank {rank}: {type(exc).__name__}: {text}\n")
        return 1
    finally:
        world.shutdown()
    if not launched_by_us and summary and int(os.environ.get("RANK", "0")) == 0:
        print_summary(summary, cfg.train.out)
    return 0


def _partial_timeline(path: str, out: str) -> None:
    """After a failed job, merge the parts the ranks that got to the end of train() wrote."""
    from disttrain import timeline

    parts = timeline.parts_folder(out, path)
    if path and os.path.isdir(parts):
        ranks = timeline.merge(parts, path)["ranks"]
        sys.stderr.write(f"disttrain: partial timeline of ranks {ranks} written to {path}\n")


def cmd_train(ns: argparse.Namespace, argv: list[str]) -> int:
    from disttrain import config, strategies
    from disttrain.launch.local import JobFailed, launch
    from disttrain.train.progress import print_summary

    flags = {k: v for k, v in vars(ns).items() if k not in ("command", "config")}
    cfg = config.load(flags, getattr(ns, "config", None))
    if _is_worker():
        launched_by_us = os.environ.get("DISTTRAIN_WORKER") == "1"
        if not cfg.train.out and not launched_by_us:  # torchrun, and no --out
            out = _torchrun_default_out(cfg.train.strategy)
            cfg = config.RunConfig(
                {**cfg.sections, config.TrainConfig: dataclasses.replace(cfg.train, out=out)}
            )
        return _run_worker(cfg, launched_by_us)
    _preflight(cfg)
    nproc = strategies.get(cfg.train.strategy).num_processes(cfg)
    out = cfg.train.out or _default_out(cfg.train.strategy)
    os.makedirs(out, exist_ok=True)
    try:
        launch(cfg.train, nproc, [*argv, "--out", out])
    except JobFailed as exc:
        sys.stderr.write(f"disttrain: error: {exc}\n")
        _partial_timeline(cfg.train.timeline, out)
        return 1
    path = os.path.join(out, "summary.json")
    if not os.path.exists(path):  # multi-node: global rank 0 ran on another node
        print(f"disttrain: done; rank 0 ran on another node and wrote its summary to its {out}")
        return 0
    with open(path) as fh:
        print_summary(json.load(fh), out)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        if ns.command == "train":
            return cmd_train(ns, argv)
        if ns.command == "cluster":
            from disttrain.launch import cluster

            return cluster.main(ns)
        if ns.command == "advise":
            from disttrain.lab import advise

            return advise.run(ns)
        if ns.command == "compare":
            from disttrain.lab import compare

            return compare.run(ns, argv)
        module = importlib.import_module(ns.bench_module)
        return int(module.run(ns))
    except UsageError as exc:
        # the contract is one line; a multi-line text from a library is cut to its first
        sys.stderr.write(f"disttrain: error: {(str(exc).strip().splitlines() or ['?'])[0]}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("disttrain: interrupted\n")
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
