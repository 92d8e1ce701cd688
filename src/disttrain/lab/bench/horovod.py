"""Horovod's synthetic benchmark on disttrain.horovod against torch DDP and disttrain's own
DistributedOptimizer, all in one run.

    disttrain bench horovod --workers 2 --image-size 64 --batch-size 16 --rounds 15

The step is Horovod's ``pytorch_synthetic_benchmark.py``'s: SGD on a ResNet-18 (torchvision's
layout, built here: torchvision is not a dependency) over one fixed random batch of
``--batch-size`` images per process, cross-entropy over 1000 classes. One world of N
processes (file store, loopback, one torch thread each) builds the three side by side,
each its own copy of the same model:

- ``horovod``: ``hvd.DistributedOptimizer(SGD, named_parameters=...)``, as the script;
- ``ddp``: ``DistributedDataParallel`` (its default buckets) with plain SGD;
- ``disttrain``: ``disttrain.DistributedOptimizer`` (fusion and overlap, its defaults).

Each round times ``--batches-per-round`` steps of each, in an order that rotates every
round, after ``--warmup`` untimed steps each, so that a burst of background load on a
shared machine hits all three alike. Figures: the job's img/s (all processes, as the
script's "Total img/sec"), median over rounds with the 25th and 75th percentiles; the
ratios are medians of paired ratios (horovod's round r against the other's round r).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["add_arguments", "run"]

CONFIGS = ("horovod", "ddp", "disttrain")
TARGET = 0.97  # issue 36: horovod >= 0.97x DDP and >= 0.97x disttrain's optimizer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=2, help="processes")
    parser.add_argument("--image-size", type=int, default=64, help="square images, pixels")
    parser.add_argument("--batch-size", type=int, default=16, help="images per process")
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds")
    parser.add_argument("--batches-per-round", type=int, default=5, help="steps timed per round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps of each first")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    parser.add_argument("--json", default="", help="write every figure to this JSON file")


def _block(cin: int, cout: int, stride: int) -> Any:
    """torchvision's BasicBlock: two 3x3 convolutions with batch norm, and the shortcut."""
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
                nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                nn.BatchNorm2d(cout),
            )
            self.short = (
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                if stride != 1 or cin != cout
                else nn.Identity()
            )

        def forward(self, x: Any) -> Any:
            return (self.body(x) + self.short(x)).relu()

    return Block()


def resnet18(num_classes: int = 1000) -> Any:
    """ResNet-18 as torchvision lays it out (11.7 M parameters at 1000 classes)."""
    from torch import nn

    layers: list[nn.Module] = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [_block(cin, cout, stride), _block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


Step = Callable[[], None]


def _build(kind: str, args: argparse.Namespace) -> tuple[Step, Any]:
    """This rank's step of ``kind`` (the synthetic benchmark's ``benchmark_step``) and its
    model."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import disttrain.horovod as hvd
    from disttrain.optimizer import DistributedOptimizer

    torch.manual_seed(0)  # the same model for all three
    model = resnet18()
    opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    net: torch.nn.Module = model
    if kind == "horovod":
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    elif kind == "ddp":
        net = DDP(model)
    else:
        opt = DistributedOptimizer(opt, named_parameters=model.named_parameters())
    g = torch.Generator().manual_seed(1 + hvd.rank())
    size = args.image_size
    data = torch.randn(args.batch_size, 3, size, size, generator=g)
    target = torch.randint(0, 1000, (args.batch_size,), generator=g)

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(net(data), target).backward()
        opt.step()

    return step, model


def _rank_main(args: argparse.Namespace) -> dict[str, Any] | None:
    """One rank's run; rank 0 returns each config's seconds per timed round, and each
    one's parameters' absolute sum at the end (the same training: they must agree)."""
    import torch.distributed as dist

    import disttrain.horovod as hvd

    hvd.init()  # adopts the world the runner joined
    built = {kind: _build(kind, args) for kind in CONFIGS}
    steps = {kind: step for kind, (step, _) in built.items()}
    for kind in CONFIGS:
        for _ in range(args.warmup):
            steps[kind]()
    seconds: dict[str, list[float]] = {kind: [] for kind in CONFIGS}
    for r in range(args.rounds):
        for k in range(len(CONFIGS)):
            kind = CONFIGS[(k + r) % len(CONFIGS)]
            dist.barrier()  # every rank starts the round's config together
            t0 = time.perf_counter()
            for _ in range(args.batches_per_round):
                steps[kind]()
            dist.barrier()  # until the slowest rank is done: the job's time
            seconds[kind].append(time.perf_counter() - t0)
    hvd.shutdown()
    sums = {
        kind: float(sum(p.detach().double().abs().sum() for p in model.parameters()))
        for kind, (_, model) in built.items()
    }
    return {"seconds": seconds, "parameter_sums": sums} if dist.get_rank() == 0 else None


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    q = len(ordered) // 4
    return statistics.median(ordered), ordered[q], ordered[-1 - q]


def _summarise(seconds: dict[str, list[float]], args: argparse.Namespace) -> dict[str, Any]:
    images = args.batch_size * args.workers * args.batches_per_round
    rows: dict[str, Any] = {}
    for kind, times in seconds.items():
        median, p25, p75 = _quartiles([images / t for t in times])
        rows[kind] = {"img_per_second": median, "p25": p25, "p75": p75}
    ours = seconds["horovod"]
    for other in ("ddp", "disttrain"):
        # paired: horovod's round r against the other's round r, moments apart
        ratios = [o / h for h, o in zip(ours, seconds[other], strict=True)]
        median, p25, p75 = _quartiles(ratios)
        rows[f"horovod/{other}"] = {"ratio": median, "p25": p25, "p75": p75}
    return rows


def _check(args: argparse.Namespace) -> None:
    from disttrain.comm.errors import UsageError

    if args.workers < 1 or args.batch_size < 1 or args.image_size < 32:
        raise UsageError("--workers and --batch-size must be >= 1, --image-size >= 32")
    if args.rounds < 1 or args.batches_per_round < 1 or args.warmup < 0:
        raise UsageError("--rounds and --batches-per-round must be >= 1, --warmup >= 0")


def run(args: argparse.Namespace) -> int:
    _check(args)
    from disttrain.launch.spawn import RankError, WorldTimeout, run_world

    try:
        # --timeout bounds the whole run and, inside it, every collective
        raw = run_world(
            _rank_main, args.workers, (args,), timeout=args.timeout, collective_timeout=args.timeout
        )[0]
    except (RankError, WorldTimeout) as exc:
        sys.stderr.write(f"disttrain: error: bench horovod failed: {str(exc).splitlines()[0]}\n")
        return 1
    assert raw is not None
    seconds, sums = raw["seconds"], raw["parameter_sums"]
    rows = _summarise(seconds, args)
    # the same model trained on the same batches: a spread here would mean unequal work
    disagree = (max(sums.values()) - min(sums.values())) / max(sums.values())
    print(
        f"bench horovod: resnet18 {args.image_size}x{args.image_size}, batch {args.batch_size} "
        f"per process, {args.workers} processes, {args.rounds} rounds of "
        f"{args.batches_per_round} steps each, interleaved (medians, [p25, p75])"
    )
    for kind in CONFIGS:
        row = rows[kind]
        spread = f"[{row['p25']:.1f}, {row['p75']:.1f}]"
        print(f"{kind:<12}{row['img_per_second']:>10.1f} img/s {spread:>18}")
    for other in ("ddp", "disttrain"):
        row = rows[f"horovod/{other}"]
        verdict = "meets" if row["ratio"] >= TARGET else "misses"
        print(
            f"horovod / {other:<10}{row['ratio']:>7.3f}x [{row['p25']:.3f}, {row['p75']:.3f}]"
            f"  ({verdict} the {TARGET}x target)"
        )
    print(f"parameters at the end agree within {disagree:.1e} (relative, absolute sums)")
    if args.json:
        with open(args.json, "w") as fh:
            record = {"args": vars(args) | {"bench_module": None}, "rows": rows}
            json.dump(record | raw | {"parameter_spread": disagree}, fh, indent=2)
    return 0
