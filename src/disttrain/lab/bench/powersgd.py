"""PowerSGD under DDP: disttrain's compressor hook against torch's powerSGD_hook and dense DDP.

    disttrain bench powersgd --workers 4 --model mlp --rank 2 --steps 60
    disttrain bench powersgd --workers 4 --model gpt --rank 4 --steps 40

One world of N processes trains three DDP replicas of the same model side by
side, in lockstep on the same batches: dense DDP (the quality anchor), torch's
``powerSGD_hook`` (the speed anchor) and disttrain's ``CompressorHook`` with
``powersgd:RANK`` (both with the same rank, start step, error feedback and
warm start). Each step runs the three in an order that rotates every step, so
background load on a shared machine hits each alike; the step-time ratio is the
median of the paired ratios (mine / torch's, step i against step i). Reported:
that ratio, the compression ratio (dense entries / entries sent, from torch's
own ``compression_stats`` and from disttrain's meter), and each replica's
test accuracy (mlp/digits) or test loss (gpt/pycode) at the end.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=4, help="data-parallel processes")
    parser.add_argument("--model", default="mlp", choices=("mlp", "gpt"))
    parser.add_argument("--rank", type=int, default=2, help="PowerSGD matrix rank")
    parser.add_argument("--batch-size", type=int, default=64, help="GLOBAL batch size")
    parser.add_argument("--lr", type=float, default=0.05, help="momentum SGD (mlp); adam: 1e-3")
    parser.add_argument("--steps", type=int, default=60, help="training steps of each replica")
    parser.add_argument("--start-step", type=int, default=10, help="dense steps first (both)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole run")
    parser.add_argument("--json", default="", help="write every figure to this JSON file")


def _rank_main(args: argparse.Namespace) -> dict[str, Any] | None:
    import torch
    import torch.distributed as dist

    from disttrain.data import load_dataset
    from disttrain.models import build_model

    rank, n = dist.get_rank(), dist.get_world_size()
    data = load_dataset("pycode" if args.model == "gpt" else "digits")
    torch.manual_seed(0)
    base = build_model(args.model, data)
    models, torch_state, mine = _replicas(args, base)
    times = _train_lockstep(args, data, models, rank, n)
    quality: dict[str, float] = {}
    with torch.no_grad():
        for k, m in models.items():
            out = m.module(data.x_test[:2000])
            y = data.y_test[:2000]
            quality[k] = (
                float(_loss_of(out, y))
                if args.model == "gpt"
                else float((out.argmax(1) == y).float().mean())
            )
    if rank:
        return None
    skip = max(2, args.start_step)  # compressed steps only
    ratios = [a / b for a, b in zip(times["disttrain"][skip:], times["torch"][skip:], strict=True)]
    sent = torch_state.total_numel_after_compression
    return {
        "step_ms": {k: 1e3 * statistics.median(v[skip:]) for k, v in times.items()},
        "ratio_disttrain_to_torch": statistics.median(ratios),
        "torch_compression_rate": torch_state.total_numel_before_compression / max(1, sent),
        # over the compressed steps, like torch's figure: dense entries / entries sent
        "disttrain_compression_rate": sum(
            c.figures()["powersgd_dense_entries"] for c, _ in mine.buckets.values()
        )
        / sum(c.figures()["powersgd_wire_entries"] for c, _ in mine.buckets.values()),
        "quality": quality,
        "metric": "test loss" if args.model == "gpt" else "test accuracy",
    }


_NAMES = ("dense", "torch", "disttrain")


def _replicas(args: argparse.Namespace, base: nn.Module) -> tuple[dict[str, DDP], Any, Any]:
    """The three DDP replicas of ``base`` (dense, torch's hook, ours), each its own copy.

    Returns them by name with torch's PowerSGD state and our hook, which hold the
    compression figures. Same rank, start step, error feedback and warm start.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ref
    from torch.nn.parallel import DistributedDataParallel

    from disttrain.compression.powersgd import PowerSGD
    from disttrain.dataparallel.ddp_hooks import CompressorHook, compressed_hook

    # One bucket each: torch's hook launches its P and Q allreduces from future callbacks,
    # and with several buckets on gloo their order differed between ranks (a collective
    # mismatch, seen on mlp's default two buckets).
    models = {k: DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=4096) for k in _NAMES}
    torch_state = ref.PowerSGDState(
        None, matrix_approximation_rank=args.rank, start_powerSGD_iter=max(2, args.start_step)
    )
    models["torch"].register_comm_hook(torch_state, ref.powerSGD_hook)
    mine = CompressorHook(lambda: PowerSGD(args.rank, start_step=max(2, args.start_step)))
    models["disttrain"].register_comm_hook(mine, compressed_hook)
    return models, torch_state, mine


def _loss_of(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over every position (gpt's tokens) or sample (mlp's)."""
    from torch.nn import functional as F

    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def _train_lockstep(
    args: argparse.Namespace, data: Any, models: dict[str, DDP], rank: int, n: int
) -> dict[str, list[float]]:
    """Train the replicas on the same batches, in an order that rotates every step.

    Each replica's step is timed from a barrier, so that background load hits
    each alike; returns each replica's step seconds.
    """
    import torch
    import torch.distributed as dist

    def optimizer(m: torch.nn.Module) -> torch.optim.Optimizer:
        if args.model == "gpt":
            return torch.optim.Adam(m.parameters(), lr=1e-3)
        return torch.optim.SGD(m.parameters(), lr=args.lr, momentum=0.9)

    opts = {k: optimizer(m) for k, m in models.items()}
    times: dict[str, list[float]] = {k: [] for k in _NAMES}
    gen = torch.Generator().manual_seed(1)
    shard = args.batch_size // n
    for i in range(args.steps):
        idx = torch.randint(0, len(data.x_train), (args.batch_size,), generator=gen)
        mine_idx = idx[rank * shard : (rank + 1) * shard]
        x, y = data.x_train[mine_idx], data.y_train[mine_idx]
        for j in range(len(_NAMES)):
            k = _NAMES[(i + j) % len(_NAMES)]
            dist.barrier()
            t0 = time.perf_counter()
            opts[k].zero_grad()
            _loss_of(models[k](x), y).backward()
            opts[k].step()
            times[k].append(time.perf_counter() - t0)
    return times


def run(args: argparse.Namespace) -> int:
    from disttrain.comm.errors import UsageError

    if args.workers < 1 or args.batch_size % args.workers or args.rank < 1:
        raise UsageError("--batch-size must be a multiple of --workers; --rank >= 1")
    if args.steps <= max(2, args.start_step):
        raise UsageError("--steps must exceed --start-step (and 2): nothing compressed otherwise")
    from disttrain.launch.spawn import RankError, WorldTimeout, run_world

    try:
        raw = run_world(
            _rank_main, args.workers, (args,), timeout=args.timeout, collective_timeout=args.timeout
        )[0]
    except (RankError, WorldTimeout) as exc:
        sys.stderr.write(f"disttrain: error: bench powersgd failed: {str(exc).splitlines()[0]}\n")
        return 1
    assert raw is not None
    print(
        f"bench powersgd: model={args.model} workers={args.workers} rank={args.rank} "
        f"steps={args.steps} (first {max(2, args.start_step)} dense) batch={args.batch_size}"
    )
    for k, ms in raw["step_ms"].items():
        print(f"  {k:<10} step {ms:8.1f} ms   {raw['metric']} {raw['quality'][k]:.4f}")
    print(
        f"  disttrain / torch step time (median of paired ratios): "
        f"{raw['ratio_disttrain_to_torch']:.3f}"
    )
    print(
        f"  compression (dense entries / entries sent): torch "
        f"{raw['torch_compression_rate']:.1f}x, disttrain {raw['disttrain_compression_rate']:.1f}x"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args) | {"bench_module": None}, **raw}, fh, indent=2)
    return 0
