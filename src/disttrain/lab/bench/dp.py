"""Data-parallel training speed against PyTorch DDP and plain PyTorch, all in one run.

    disttrain bench dp --workers 2 --model mlp --batch-size 64 --json dp.json
    disttrain bench dp --workers 2 --model mlp --sweep        # fusion 0, 1, 4, 25, 64 MB

One world of N processes (file store, loopback, one torch thread each) builds
every configuration side by side and times them step by step: config A's step
i, then B's step i, ..., in an order that rotates every step, after
``--warmup`` untimed steps each, so a burst of background load on a shared
machine hits every configuration alike. The configurations: plain single-
process PyTorch at the global batch and disttrain with one worker (both on rank
0 while the others wait in a barrier), PyTorch DDP twice, with
``bucket_cap_mb=--fusion-mb`` (the anchor: same bucket size) and with its
defaults (a 1 MB first bucket, then 25 MB), and disttrain's data parallelism
with fusion and overlap on and off. Each figure is the median samples/s over
the timed steps with the 25th and 75th percentiles; ratios to DDP are medians
of paired ratios (step i against DDP's step i). The per-step breakdown splits a
step into forward+backward (with the gradient hooks and launches), the wait for
communication after backward, and the optimizer step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from disttrain.strategies.allreduce import DEFAULT_FUSION_MB

__all__ = ["add_arguments", "run"]

SWEEP_MB = (0.0, 1.0, 4.0, 25.0, 64.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=2, help="data-parallel processes")
    parser.add_argument("--model", default="mlp", choices=("mlp", "cnn", "gpt"))
    parser.add_argument("--batch-size", type=int, default=64, help="GLOBAL batch size")
    parser.add_argument("--algorithm", default="native", help="allreduce algorithm for disttrain")
    parser.add_argument(
        "--fusion-mb", type=float, default=DEFAULT_FUSION_MB, help="bucket size (DDP's too)"
    )
    parser.add_argument("--steps", type=int, default=60, help="timed steps per config")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps of each config first")
    parser.add_argument("--sweep", action="store_true", help="fusion thresholds 0,1,4,25,64 MB")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    parser.add_argument("--json", default="", help="write every figure to this JSON file")


def _configs(args: argparse.Namespace) -> list[dict[str, Any]]:
    f = args.fusion_mb
    out: list[dict[str, Any]] = [
        {"name": "plain", "kind": "plain"},
        {"name": "disttrain-1", "kind": "dt1"},
        {"name": "ddp", "kind": "ddp", "fusion_mb": f},
        {"name": "ddp default-buckets", "kind": "ddp", "fusion_mb": None},
    ]
    if args.sweep:
        for mb in SWEEP_MB:
            out.append(
                {
                    "name": f"dp fusion={mb:g} overlap",
                    "kind": "dp",
                    "fusion_mb": mb,
                    "overlap": True,
                }
            )
        return out
    for mb in (f, 0.0):
        for overlap in (True, False):
            out.append(
                {
                    "name": f"dp fusion={mb:g} {'overlap' if overlap else 'no-overlap'}",
                    "kind": "dp",
                    "fusion_mb": mb,
                    "overlap": overlap,
                }
            )
    return out


class _Timer:
    """Per-phase seconds of each step (forward_backward, wait, optimizer)."""

    def __init__(self) -> None:
        self.phases: dict[str, list[float]] = {}

    def time(self, phase: str, fn: Callable[[], Any]) -> None:
        t0 = time.perf_counter()
        fn()
        self.phases.setdefault(phase, []).append(time.perf_counter() - t0)


Step = Callable[[int, _Timer], None]


def _build(cfg: dict[str, Any], args: argparse.Namespace, data: Any) -> tuple[Step, Any] | None:
    """This rank's step function for ``cfg`` (None: the config runs on rank 0 only)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from disttrain import config, strategies
    from disttrain.comm import world as world_mod
    from disttrain.models import build_model
    from disttrain.strategies.allreduce import AllReduce
    from disttrain.strategies.capabilities import before_step
    from disttrain.train.trainer import loss_fn

    world = world_mod.current()
    n, rank = world.world_size, world.rank
    single = cfg["kind"] in ("plain", "dt1")
    if single and rank != 0:
        return None
    torch.manual_seed(0)
    model = build_model(args.model, data)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    local = args.batch_size if single else args.batch_size // n
    g = torch.Generator().manual_seed(1 + (0 if single else rank))
    batches = [torch.randint(0, len(data.x_train), (local,), generator=g) for _ in range(8)]
    xs = [data.x_train[b] for b in batches]
    ys = [data.y_train[b] for b in batches]

    if cfg["kind"] in ("plain", "ddp"):
        net = DDP(model, bucket_cap_mb=cfg["fusion_mb"]) if cfg["kind"] == "ddp" else model

        def step(i: int, timer: _Timer) -> None:
            x, y = xs[i % 8], ys[i % 8]
            opt.zero_grad(set_to_none=True)
            timer.time("forward_backward", lambda: loss_fn(net(x), y).backward())
            timer.time("optimizer", opt.step)

        return step, None
    flags = {
        "algorithm": args.algorithm,
        "workers": 1 if single else n,
        "batch_size": args.batch_size,
        "fusion_mb": cfg.get("fusion_mb", args.fusion_mb),
        "overlap": cfg.get("overlap", True),
    }
    w = world_mod.World(0, 1, 0, world.backend, world.device, world.timeout) if single else world
    strategy = strategies.get("allreduce").build(config.load(flags), w, loss_fn)
    assert isinstance(strategy, AllReduce)
    strategy.setup(model, opt)

    def dp_step(i: int, timer: _Timer) -> None:
        x, y = xs[i % 8], ys[i % 8]
        before_step(strategy, i + 1)  # the step runner's order (a model's buffers, if any)
        opt.zero_grad(set_to_none=True)
        timer.time("forward_backward", lambda: strategy.forward_backward(x, y))
        timer.time("wait", strategy.after_backward)
        timer.time("optimizer", opt.step)
        strategy.after_step(i + 1)

    return dp_step, strategy


def _rank_main(args: argparse.Namespace) -> dict[str, Any] | None:
    """One rank's run, in the world the runner joined; rank 0 returns the raw figures."""
    import torch.distributed as dist

    from disttrain.data import load_dataset

    data = load_dataset("pycode" if args.model == "gpt" else "digits")  # default settings
    configs = _configs(args)
    built = [_build(c, args, data) for c in configs]
    timers = [_Timer() for _ in configs]
    times: list[list[float]] = [[] for _ in configs]
    scratch = _Timer()
    # Step-level interleaving: config A's step i, B's step i, ... in an order that
    # rotates every step, so a burst of background load hits every config alike.
    for i in range(args.warmup + args.steps):
        for k in range(len(configs)):
            c = (k + i) % len(configs)
            dist.barrier()
            entry = built[c]
            if entry is None:
                continue
            t0 = time.perf_counter()
            entry[0](i, scratch if i < args.warmup else timers[c])
            if i >= args.warmup:
                times[c].append(time.perf_counter() - t0)
    dist.barrier()
    raw: dict[str, Any] = {}
    for c, cfg in enumerate(configs):
        strategy = built[c][1] if built[c] is not None else None  # type: ignore[index]
        extra = {}
        if strategy is not None:
            stats = strategy.reducer.stats()
            extra = {
                "buckets": stats["buckets"],
                "launched_in_backward_per_step": stats["launched_in_backward"]
                / (args.warmup + args.steps),
            }
            strategy.finish()
        raw[cfg["name"]] = (times[c], timers[c].phases, extra)
    return raw if dist.get_rank() == 0 else None


def _summarise(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    b = args.batch_size
    rows: dict[str, Any] = {}
    ddp = raw["ddp"][0]
    for name, (times, phases, extra) in raw.items():
        sps = sorted(b / t for t in times)
        q = len(sps) // 4
        rows[name] = {
            "samples_per_second": statistics.median(sps),
            "p25": sps[q],
            "p75": sps[-1 - q],
            # paired: step i of this config against step i of DDP, run moments apart
            "ratio_to_ddp": statistics.median(d / t for t, d in zip(times, ddp, strict=True)),
            "step_ms": {k: round(statistics.median(v) * 1e3, 3) for k, v in phases.items()},
            **extra,
        }
    rows["disttrain-1"]["ratio_to_plain"] = statistics.median(
        p / t for t, p in zip(raw["disttrain-1"][0], raw["plain"][0], strict=True)
    )
    return rows


def run(args: argparse.Namespace) -> int:
    from disttrain.comm.errors import UsageError

    if args.workers < 1 or args.batch_size % args.workers:
        raise UsageError(f"--batch-size {args.batch_size} must be a multiple of --workers")
    if args.steps < 1 or args.warmup < 0 or args.fusion_mb < 0:
        raise UsageError("--steps must be >= 1, --warmup and --fusion-mb >= 0")
    from disttrain import collectives

    collectives.get(args.algorithm)  # an unknown name: the registry's usage error
    from disttrain.launch.spawn import RankError, WorldTimeout, run_world

    try:
        # --timeout bounds the whole run and, inside it, every collective
        raw = run_world(
            _rank_main, args.workers, (args,), timeout=args.timeout, collective_timeout=args.timeout
        )[0]
    except (RankError, WorldTimeout) as exc:
        sys.stderr.write(f"disttrain: error: bench dp failed: {str(exc).splitlines()[0]}\n")
        return 1
    assert raw is not None
    rows = _summarise(raw, args)
    print(
        f"bench dp: model={args.model} workers={args.workers} batch={args.batch_size} "
        f"algorithm={args.algorithm} steps={args.steps} per config, interleaved "
        "step by step (shared machine: medians, [p25, p75])"
    )
    print(f"{'config':<28}{'samples/s':>11}{'[p25, p75]':>20}{'/DDP':>7}   step ms (median)")
    for name, row in rows.items():
        spread = f"[{row['p25']:.0f}, {row['p75']:.0f}]"
        phases = " ".join(f"{k}={v:.1f}" for k, v in row["step_ms"].items())
        print(
            f"{name:<28}{row['samples_per_second']:>11.0f}{spread:>20}"
            f"{row['ratio_to_ddp']:>7.3f}   {phases}"
        )
    print(f"disttrain-1 / plain = {rows['disttrain-1']['ratio_to_plain']:.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args) | {"bench_module": None}, "rows": rows}, fh, indent=2)
    return 0
