"""ZeRO stages 1-3 against the allreduce strategy, torch's ZeroRedundancyOptimizer and FSDP2.

    disttrain bench zero --workers 2 --model mlp --steps 30 --json zero.json

One world of N processes builds every configuration side by side from the same
seed, with Adam, and times them step by step, interleaved in an order that
rotates every step (as ``bench dp``), so background load hits all alike:

- ``allreduce``: disttrain's allreduce strategy (the anchor of stage 2);
- ``zero-1``, ``zero-2``, ``zero-3``: ``--strategy zero`` at each stage;
- ``torch-zero1``: PyTorch DDP + ``torch.distributed.optim.ZeroRedundancyOptimizer``
  (the anchor of stage 1);
- ``fsdp2``: PyTorch ``fully_shard`` on each child module and the root, on a
  CPU device mesh over gloo (the anchor of stage 3); if it fails here, its row
  holds the exact error.

Reported: the median step time with p25/p75, the median of paired ratios to
each stage's anchor (step i against the anchor's step i), the bytes each
disttrain configuration holds (``capabilities.memory``), and the largest
difference of each configuration's parameters from the allreduce strategy's
after the last step (all took the same steps on the same batches). Then where
each step's time went (medians, ms; :data:`PHASES`): ``fwd+bwd`` (forward and
backward, with the reductions launched or, for DDP, waited for in it),
``grad wait`` (what remained of them after backward), ``optimizer`` (the
optimizer's step; torch's ZeroRedundancyOptimizer broadcasts the parameters in
it) and ``after step`` (ZeRO stages 1 and 2: the parameters' all-gather).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from disttrain.strategies.spec import parse_one

__all__ = ["add_arguments", "run"]

#: our configurations, each a run spec of the strategies' grammar (strategies/spec.py)
SPECS = {
    "allreduce": "allreduce",
    "zero-1": "zero:zero_stage=1",
    "zero-2": "zero:zero_stage=2",
    "zero-3": "zero:zero_stage=3",
}
CONFIGS = (*SPECS, "torch-zero1", "fsdp2")
#: the anchor each configuration's ratio is taken against
ANCHORS = {"zero-1": "torch-zero1", "zero-2": "allreduce", "zero-3": "fsdp2"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=2, help="data-parallel processes")
    parser.add_argument("--model", default="mlp", choices=("mlp", "cnn", "gpt"))
    parser.add_argument("--batch-size", type=int, default=64, help="GLOBAL batch size")
    parser.add_argument("--algorithm", default="native", help="collective algorithm for disttrain")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per config")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps of each config first")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    parser.add_argument("--json", default="", help="write every figure to this JSON file")


#: the parts of a step timed apart (torch's configurations have no grad wait or after step)
PHASES = ("fwd+bwd", "grad wait", "optimizer", "after step")

#: a step: runs step i, returns the seconds of each of :data:`PHASES` it has
Step = Callable[[int], dict[str, float]]


def _build(name: str, args: argparse.Namespace, data: Any) -> tuple[Step, Any, Any]:
    """This rank's step for configuration ``name``, its strategy (disttrain) and model."""
    import torch

    from disttrain.comm import world as world_mod
    from disttrain.models import build_model

    world = world_mod.current()
    n, rank = world.world_size, world.rank
    torch.manual_seed(0)
    model = build_model(args.model, data)
    g = torch.Generator().manual_seed(1 + rank)
    batches = [
        torch.randint(0, len(data.x_train), (args.batch_size // n,), generator=g) for _ in range(8)
    ]
    xs, ys = [data.x_train[b] for b in batches], [data.y_train[b] for b in batches]
    if name in ("torch-zero1", "fsdp2"):
        return _torch_step(name, model, xs, ys), None, model
    step, strategy = _disttrain_step(name, args, model, xs, ys)
    return step, strategy, model


def _torch_step(name: str, model: Any, xs: list[Any], ys: list[Any]) -> Step:
    """PyTorch's anchors: DDP + ZeroRedundancyOptimizer (``torch-zero1``), or ``fsdp2``:
    ``fully_shard`` on each child module that has parameters, then on the root."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from disttrain.train.trainer import loss_fn

    if name == "torch-zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        net: Any = DDP(model)
        opt: Any = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-3)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for child in model.children():
            if any(True for _ in child.parameters()):
                fully_shard(child, mesh=mesh)
        net = fully_shard(model, mesh=mesh)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def torch_step(i: int) -> dict[str, float]:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_fn(net(xs[i % 8]), ys[i % 8]).backward()
        t1 = time.perf_counter()
        opt.step()
        return {"fwd+bwd": t1 - t0, "optimizer": time.perf_counter() - t1}

    return torch_step


def _disttrain_step(
    name: str, args: argparse.Namespace, model: Any, xs: list[Any], ys: list[Any]
) -> tuple[Step, Any]:
    """disttrain's configuration ``name`` (its run spec in :data:`SPECS`), with Adam.

    Its step times each of :data:`PHASES` apart; returns it with the strategy.
    """
    import torch

    from disttrain import config, strategies
    from disttrain.comm import world as world_mod
    from disttrain.strategies.capabilities import before_step
    from disttrain.train.trainer import loss_fn

    world = world_mod.current()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    flags: dict[str, Any] = {
        "workers": world.world_size,
        "batch_size": args.batch_size,
        "lr": 1e-3,
        "algorithm": args.algorithm,
        "optimizer": "adam",
    }
    flags = parse_one(SPECS[name]).flags(flags)  # the variant's strategy and settings
    strategy = strategies.get(flags["strategy"]).build(config.load(flags), world, loss_fn)
    strategy.setup(model, opt)

    def dt_step(i: int) -> dict[str, float]:
        t = [time.perf_counter()]
        before_step(strategy, i + 1)  # the step runner's order (zero: stale gradients go)
        opt.zero_grad(set_to_none=True)
        strategy.forward_backward(xs[i % 8], ys[i % 8])
        t.append(time.perf_counter())
        strategy.after_backward()
        t.append(time.perf_counter())
        opt.step()
        t.append(time.perf_counter())
        strategy.after_step(i + 1)
        t.append(time.perf_counter())
        return {name: b - a for name, a, b in zip(PHASES, t[:-1], t[1:], strict=True)}

    return dt_step, strategy


def _full_params(name: str, strategy: Any, model: Any) -> list[Any]:
    """Every parameter, whole, on every rank (collective for the sharded ones)."""
    import torch

    if name == "fsdp2":
        return [p.full_tensor().detach().clone() for p in model.parameters()]
    if strategy is not None:  # collective; stage 3 gathers every layer on every rank
        strategy.eval_model()
    return [p.detach().clone() for p in model.parameters() if torch.is_tensor(p)]


def _rank_main(args: argparse.Namespace) -> dict[str, Any] | None:
    import torch.distributed as dist

    from disttrain.data import load_dataset
    from disttrain.strategies.capabilities import memory as counted_memory

    data = load_dataset("pycode" if args.model == "gpt" else "digits")
    built: dict[str, tuple[Step, Any, Any]] = {}
    errors: dict[str, str] = {}
    for name in CONFIGS:
        try:
            built[name] = _build(name, args, data)
        except Exception as exc:  # FSDP2 on gloo/CPU may refuse: reported, not raised
            errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    names = [c for c in CONFIGS if c in built]
    times: dict[str, list[float]] = {c: [] for c in names}
    phases: dict[str, dict[str, list[float]]] = {c: {} for c in names}
    for i in range(args.warmup + args.steps):
        for k in range(len(names)):
            name = names[(k + i) % len(names)]
            dist.barrier()
            t0 = time.perf_counter()
            parts = built[name][0](i)
            if i >= args.warmup:
                times[name].append(time.perf_counter() - t0)
                for part, seconds in parts.items():
                    phases[name].setdefault(part, []).append(seconds)
    dist.barrier()
    held = {
        n: counted_memory(built[n][1]) for n in names if built[n][1] is not None
    }  # end of a step
    reference = _full_params("allreduce", *built["allreduce"][1:])
    raw: dict[str, Any] = {"errors": errors, "rows": {}}
    for name in names:
        _, strategy, model = built[name]
        memory = held.get(name)
        params = _full_params(name, strategy, model)
        diff = max(float((a - b).abs().max()) for a, b in zip(params, reference, strict=True))
        if strategy is not None:
            strategy.finish()
        raw["rows"][name] = {
            "times": times[name],
            "max_diff_vs_allreduce": diff,
            "memory": memory,
            "phases": phases[name],
        }
    return raw if dist.get_rank() == 0 else None


def _summarise(raw: dict[str, Any]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for name, r in raw["rows"].items():
        t = sorted(r["times"])
        q = len(t) // 4
        row = {
            "step_ms": statistics.median(t) * 1e3,
            "p25_ms": t[q] * 1e3,
            "p75_ms": t[-1 - q] * 1e3,
            "max_diff_vs_allreduce": r["max_diff_vs_allreduce"],
            "memory": r["memory"],
            "phases_ms": {k: statistics.median(v) * 1e3 for k, v in r["phases"].items()},
        }
        anchor = ANCHORS.get(name)
        if anchor in raw["rows"]:
            pairs = zip(r["times"], raw["rows"][anchor]["times"], strict=True)
            row[f"ratio_to_{anchor}"] = statistics.median(a / b for a, b in pairs)
        rows[name] = row
    return rows


def run(args: argparse.Namespace) -> int:
    from disttrain.comm.errors import UsageError

    if args.workers < 1 or args.batch_size % args.workers:
        raise UsageError(f"--batch-size {args.batch_size} must be a multiple of --workers")
    if args.steps < 1 or args.warmup < 0:
        raise UsageError("--steps must be >= 1 and --warmup >= 0")
    from disttrain.launch.spawn import RankError, WorldTimeout, run_world

    try:
        raw = run_world(
            _rank_main, args.workers, (args,), timeout=args.timeout, collective_timeout=args.timeout
        )[0]
    except (RankError, WorldTimeout) as exc:
        sys.stderr.write(f"disttrain: error: bench zero failed: {str(exc).splitlines()[0]}\n")
        return 1
    assert raw is not None
    rows = _summarise(raw)
    print(
        f"bench zero: model={args.model} workers={args.workers} batch={args.batch_size} adam "
        f"algorithm={args.algorithm} steps={args.steps} interleaved (medians, [p25, p75])"
    )
    print(
        f"{'config':<14}{'step ms':>9}{'[p25, p75]':>18}  {'ratio to anchor':<26}"
        f"{'max |Δ| vs allreduce':>22}  bytes (params/grads/optimizer)"
    )
    for name, row in rows.items():
        ratio = next(
            (f"{v:.3f} × {k[9:]}" for k, v in row.items() if k.startswith("ratio_to_")), ""
        )
        mem = row["memory"]
        held = f"{mem['parameters']}/{mem['gradients']}/{mem['optimizer_state']}" if mem else "-"
        spread = f"[{row['p25_ms']:.1f}, {row['p75_ms']:.1f}]"
        print(
            f"{name:<14}{row['step_ms']:>9.1f}{spread:>18}  {ratio:<26}"
            f"{row['max_diff_vs_allreduce']:>22.2e}  {held}"
        )
    print(
        f"where the time went (medians, ms): {'config':<14}" + "".join(f"{p:>12}" for p in PHASES)
    )
    for name, row in rows.items():
        parts = row["phases_ms"]
        cells = (f"{parts[p]:>12.1f}" if p in parts else f"{'-':>12}" for p in PHASES)
        print(f"{'':35}{name:<14}" + "".join(cells))
    for name, error in raw["errors"].items():
        print(f"{name}: failed: {error}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "args": vars(args) | {"bench_module": None},
                    "rows": rows,
                    "errors": raw["errors"],
                },
                fh,
                indent=2,
            )
    return 0
