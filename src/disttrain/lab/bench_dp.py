"""Data-parallel training speed against PyTorch DDP and plain PyTorch, all in one run.

    disttrain bench dp --workers 2 --model mlp --batch-size 64 --json dp.json
    disttrain bench dp --workers 2 --model mlp --sweep        # fusion 0, 1, 4, 25, 64 MB

One world of N processes (file store, loopback, one torch thread each) times,
round after round, every configuration for ``--steps`` steps after
``--warmup``: plain single-process PyTorch at the global batch and disttrain
with one worker (both on rank 0 while the others wait in a barrier), PyTorch
DDP (``bucket_cap_mb`` = ``--fusion-mb``), and disttrain's data parallelism
with fusion and overlap on and off. DDP runs twice: with
``bucket_cap_mb=--fusion-mb`` (the anchor: same bucket size) and with its
defaults (no cap given: a 1 MB first bucket, then 25 MB). Configurations are
interleaved and their order rotates every round, so background load on a shared
machine hits all of them alike. Each figure is the median over rounds of the
round's samples/s (from its median step time), with the min and max over
rounds; ratios to DDP are the median of the per-round ratios. The per-step
breakdown splits a step into forward+backward (with the gradient hooks and
launches), the wait for communication after backward, and the optimizer step.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

__all__ = ["add_arguments", "run"]

SWEEP_MB = (0.0, 1.0, 4.0, 25.0, 64.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=2, help="data-parallel processes")
    parser.add_argument("--model", default="mlp", choices=("mlp", "cnn", "gpt"))
    parser.add_argument("--batch-size", type=int, default=64, help="GLOBAL batch size")
    parser.add_argument("--algorithm", default="native", help="allreduce algorithm for disttrain")
    parser.add_argument("--fusion-mb", type=float, default=25.0, help="bucket size (DDP's too)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per config and round")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before each run")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved repetitions")
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
            out.append({"name": f"dp fusion={mb:g} overlap", "kind": "dp", "fusion_mb": mb,
                        "overlap": True})  # fmt: skip
        return out
    for mb in (f, 0.0):
        for overlap in (True, False):
            out.append({"name": f"dp fusion={mb:g} {'overlap' if overlap else 'no-overlap'}",
                        "kind": "dp", "fusion_mb": mb, "overlap": overlap})  # fmt: skip
    return out


class _Timer:
    def __init__(self) -> None:
        self.phases: dict[str, list[float]] = {}

    def add(self, phase: str, seconds: float) -> None:
        self.phases.setdefault(phase, []).append(seconds)


def _timed_steps(
    step: Callable[[int, _Timer], None], steps: int, warmup: int
) -> tuple[list[float], dict[str, float]]:
    scratch = _Timer()
    for i in range(warmup):
        step(i, scratch)
    timer = _Timer()
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        step(warmup + i, timer)
        times.append(time.perf_counter() - t0)
    return times, {k: statistics.median(v) for k, v in timer.phases.items()}


def _one_config(cfg: dict[str, Any], args: argparse.Namespace, data: Any) -> Any:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from disttrain import config, strategies
    from disttrain.comm import world as world_mod
    from disttrain.models import build_model
    from disttrain.strategies.allreduce import AllReduce
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

    def timed(timer: _Timer, phase: str, fn: Callable[[], Any]) -> None:
        t0 = time.perf_counter()
        fn()
        timer.add(phase, time.perf_counter() - t0)

    if cfg["kind"] in ("plain", "ddp"):
        net = DDP(model, bucket_cap_mb=cfg["fusion_mb"]) if cfg["kind"] == "ddp" else model

        def step(i: int, timer: _Timer) -> None:
            x, y = xs[i % 8], ys[i % 8]
            opt.zero_grad(set_to_none=True)
            timed(timer, "forward_backward", lambda: loss_fn(net(x), y).backward())
            timed(timer, "optimizer", opt.step)

        times, phases = _timed_steps(step, args.steps, args.warmup)
        return times, phases, {}
    flags = {"algorithm": args.algorithm, "workers": 1 if single else n,
             "batch_size": args.batch_size, "fusion_mb": cfg.get("fusion_mb", args.fusion_mb),
             "overlap": cfg.get("overlap", True)}  # fmt: skip
    run_cfg = config.load(flags)
    w = world_mod.World(0, 1, 0, world.backend, world.device, world.timeout) if single else world
    strategy = strategies.get("allreduce")(run_cfg, w, loss_fn)
    assert isinstance(strategy, AllReduce)
    strategy.setup(model, opt)

    def dp_step(i: int, timer: _Timer) -> None:
        x, y = xs[i % 8], ys[i % 8]
        opt.zero_grad(set_to_none=True)
        timed(timer, "forward_backward", lambda: strategy.forward_backward(x, y))
        timed(timer, "wait", strategy.after_backward)
        timed(timer, "optimizer", opt.step)
        strategy.after_step(i + 1)

    times, phases = _timed_steps(dp_step, args.steps, args.warmup)
    stats = strategy.reducer.stats()
    strategy.finish()
    if not single:
        dist.barrier()
    return times, phases, {"buckets": stats["buckets"],
                           "launched_in_backward": stats["launched_in_backward"]}  # fmt: skip


def _rank_main(rank: int, n: int, store: str, args: argparse.Namespace, results: Any) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n),
                       "DISTTRAIN_STORE_FILE": store})  # fmt: skip
    import torch.distributed as dist

    from disttrain.comm import world as world_mod
    from disttrain.data import load_dataset

    try:
        world_mod.init(timeout=args.timeout)
        data = load_dataset("pycode" if args.model == "gpt" else "digits", 2048, 64, 10, 64,
                            400_000)  # fmt: skip
        configs = _configs(args)
        raw: dict[str, list[Any]] = {c["name"]: [] for c in configs}
        for r in range(args.rounds):
            shift = r % len(configs)  # rotate the order every round
            for cfg in configs[shift:] + configs[:shift]:
                dist.barrier()
                out = _one_config(cfg, args, data)
                if out is not None:
                    raw[cfg["name"]].append(out)
            dist.barrier()
        results.put((rank, True, raw if rank == 0 else None))
    except BaseException as exc:
        results.put((rank, False, f"{type(exc).__name__}: {exc}"))
    finally:
        world_mod.shutdown()


def _summarise(raw: dict[str, list[Any]], args: argparse.Namespace) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    ddp_rounds = [args.batch_size / statistics.median(t) for t, _, _ in raw["ddp"]]
    for name, runs in raw.items():
        sps = [args.batch_size / statistics.median(t) for t, _, _ in runs]
        phases: dict[str, float] = {}
        for key in runs[0][1]:
            phases[key] = statistics.median(p[key] for _, p, _ in runs) * 1e3
        rows[name] = {
            "samples_per_second": statistics.median(sps),
            "min": min(sps),
            "max": max(sps),
            "rounds": sps,
            "ratio_to_ddp": statistics.median(a / b for a, b in zip(sps, ddp_rounds, strict=True)),
            "step_ms": {k: round(v, 3) for k, v in phases.items()},
            **runs[0][2],
        }
    rows["disttrain-1"]["ratio_to_plain"] = statistics.median(
        a / b for a, b in zip(rows["disttrain-1"]["rounds"], rows["plain"]["rounds"], strict=True)
    )
    return rows


def run(args: argparse.Namespace) -> int:
    from disttrain.comm.errors import UsageError

    if args.workers < 1 or args.batch_size % args.workers:
        raise UsageError(f"--batch-size {args.batch_size} must be a multiple of --workers")
    if args.steps < 1 or args.rounds < 1 or args.warmup < 0 or args.fusion_mb < 0:
        raise UsageError("--steps and --rounds must be >= 1, --warmup and --fusion-mb >= 0")
    from disttrain import collectives

    if args.algorithm not in collectives.ALGORITHMS:
        raise UsageError(
            f"unknown algorithm {args.algorithm!r}: {', '.join(collectives.ALGORITHMS)}"
        )
    ctx = mp.get_context("spawn")
    store = os.path.join(tempfile.mkdtemp(prefix="disttrain-bench-dp-"), "store")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, args.workers, store, args, results))
             for r in range(args.workers)]  # fmt: skip
    for p in procs:
        p.start()
    raw = None
    try:
        for _ in range(args.workers):
            rank, ok, value = results.get(timeout=args.timeout)
            if not ok:
                raise RuntimeError(f"rank {rank}: {value}")
            if rank == 0:
                raw = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    assert raw is not None
    rows = _summarise(raw, args)
    print(f"bench dp: model={args.model} workers={args.workers} batch={args.batch_size} "
          f"algorithm={args.algorithm} steps={args.steps}x{args.rounds} rounds (shared machine: "
          "medians over interleaved rounds)")  # fmt: skip
    print(f"{'config':<28}{'samples/s':>11}{'[min, max]':>20}{'/DDP':>7}   step ms (median)")
    for name, row in rows.items():
        spread = f"[{row['min']:.0f}, {row['max']:.0f}]"
        phases = " ".join(f"{k}={v:.1f}" for k, v in row["step_ms"].items())
        print(f"{name:<28}{row['samples_per_second']:>11.0f}{spread:>20}"
              f"{row['ratio_to_ddp']:>7.3f}   {phases}")  # fmt: skip
    print(f"disttrain-1 / plain = {rows['disttrain-1']['ratio_to_plain']:.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args) | {"bench_module": None}, "rows": rows}, fh, indent=2)
    return 0
