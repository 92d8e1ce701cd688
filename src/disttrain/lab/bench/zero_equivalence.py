"""ZeRO's equivalence matrix: stages 1-3 against the allreduce strategy and one process.

    disttrain bench zero-equivalence --workers 1,2,3,4 --steps 20 --json matrix.json

For every world size N one world of N processes runs, for every model (mlp, cnn,
gpt, small sizes) and optimizer (sgd, momentum, adam), the same ``--steps`` steps
on the same global batches from the same seed:

- ``allreduce``: disttrain's allreduce strategy;
- ``zero-1``, ``zero-2``, ``zero-3``: ``--strategy zero`` at each stage;
- ``one process``: on rank 0, a plain model and optimizer taking each whole global
  batch (no disttrain strategy at all), the reference of both.

Each rank takes its slice of every global batch (as the trainer's sampler does),
so every configuration computes the same averaged gradient, summed in another
order. A cell is the largest |difference| of any parameter after the last step;
one over ``--tolerance`` (default 1e-5, the issue's target) is a miss, and the
command exits 1 after printing the whole table. The column "but key bias" is a
row's largest difference outside the elements whose gradient is zero in exact
arithmetic (a gpt's key bias, :func:`_null_mask`), where Adam turns rounding
noise into updates of about ``lr`` for any two summation orders.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from disttrain.lab.bench.zero import SPECS
from disttrain.strategies.spec import parse_one

__all__ = ["add_arguments", "run"]

MODELS = ("mlp", "cnn", "gpt")
OPTIMIZERS = ("sgd", "momentum", "adam")
STRATEGIES = tuple(SPECS)  # bench zero's configurations, each a run spec
#: the learning rate of each optimizer: large enough that 20 steps move every weight
LR = {"sgd": 0.05, "momentum": 0.05, "adam": 0.002}
#: the gpt's context (characters): short, so the matrix stays quick
SEQ_LEN = 16


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give world sizes like 1,2,3,4") from None


def _names(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [v for v in text.split(",") if v]
        bad = [v for v in names if v not in choices]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"{bad or text!r}: choose from {','.join(choices)}")
        return names

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workers",
        type=_ints,
        default=[1, 2, 3, 4],
        help="world sizes, comma-separated (one world each)",
    )
    parser.add_argument("--models", type=_names(MODELS), default=list(MODELS))
    parser.add_argument("--optimizers", type=_names(OPTIMIZERS), default=list(OPTIMIZERS))
    parser.add_argument("--steps", type=int, default=20, help="steps of every configuration")
    parser.add_argument("--batch-size", type=int, default=24, help="GLOBAL batch size")
    parser.add_argument("--algorithm", default="native", help="collective algorithm")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="largest |Δ| accepted")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "float64"),
        help="of the models, data and sums (float64: rounding ~1e-16)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per world")
    parser.add_argument("--json", default="", help="write every cell to this JSON file")


def _model(name: str, data: Any) -> Any:
    """The registered architecture at a small size (mlp, gpt) or as registered (cnn: 0.17M)."""
    from disttrain.models import cnn, gpt, mlp

    if name == "mlp":
        return mlp(data.in_features, data.num_classes, hidden=(32, 32))
    if name == "cnn":
        return cnn(data.in_features, data.num_classes)
    return gpt(vocab=data.num_classes, seq_len=SEQ_LEN, dim=32, heads=2, layers=2)


def _data(model: str) -> Any:
    """The model's data set; features in the default dtype (``--dtype``)."""
    import dataclasses

    import torch

    from disttrain.config import DataConfig
    from disttrain.data import load_dataset

    if model == "gpt":
        return load_dataset(DataConfig(dataset="pycode", pycode_chars=20_000, seq_len=SEQ_LEN))
    data = load_dataset("digits")
    return dataclasses.replace(data, x_train=data.x_train.to(torch.get_default_dtype()))


def _train(
    name: str,
    model_name: str,
    optimizer: str,
    args: argparse.Namespace,
    data: Any,
    batches: list[Any],
) -> dict[str, Any]:
    """Every parameter, by name, after ``args.steps`` steps of configuration ``name`` on this rank's
    slices of ``batches`` (collective; stage 3 gathers every layer on every rank)."""
    import torch

    from disttrain import config, strategies
    from disttrain.comm import world as world_mod
    from disttrain.strategies.capabilities import before_step
    from disttrain.train.optimizers import make_optimizer
    from disttrain.train.trainer import loss_fn

    world = world_mod.current()
    n, rank = world.world_size, world.rank
    flags: dict[str, Any] = {
        "workers": n,
        "batch_size": args.batch_size,
        "lr": LR[optimizer],
        "algorithm": args.algorithm,
        "optimizer": optimizer,
    }
    flags = parse_one(SPECS[name]).flags(flags)  # the variant's strategy and settings
    cfg = config.load(flags)
    torch.manual_seed(0)
    model = _model(model_name, data)
    opt = make_optimizer(model.parameters(), cfg.train)
    strategy = strategies.get(cfg.train.strategy).build(cfg, world, loss_fn)
    strategy.setup(model, opt)
    part = args.batch_size // n
    for i, index in enumerate(batches):
        mine = index[rank * part : (rank + 1) * part]
        before_step(strategy, i + 1)  # the step runner's order (zero: stale gradients go)
        opt.zero_grad(set_to_none=True)
        strategy.forward_backward(data.x_train[mine], data.y_train[mine])
        strategy.after_backward()
        opt.step()
        strategy.after_step(i + 1)
    strategy.eval_model()  # stage 3: every layer gathered on every rank until the next step
    params = {k: p.detach().clone() for k, p in model.named_parameters()}
    strategy.finish()
    return params


def _one_process(
    model_name: str, optimizer: str, args: argparse.Namespace, data: Any, batches: list[Any]
) -> dict[str, Any]:
    """The reference: a plain model and optimizer, each step on the whole global batch."""
    import torch

    from disttrain import config
    from disttrain.train.optimizers import make_optimizer
    from disttrain.train.trainer import loss_fn

    cfg = config.load({"lr": LR[optimizer], "optimizer": optimizer, "workers": 1})
    torch.manual_seed(0)
    model = _model(model_name, data)
    opt = make_optimizer(model.parameters(), cfg.train)
    for index in batches:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(data.x_train[index]), data.y_train[index]).backward()
        opt.step()
    return {k: p.detach().clone() for k, p in model.named_parameters()}


def _null_mask(name: str, p: Any) -> Any:
    """True where the gradient is zero in exact arithmetic: the key third of a gpt
    block's ``qkv.bias`` (softmax(q·(k + b)) = softmax(q·k + q·b) and q·b is the same
    for every key of a query). Computed, it is rounding noise, which Adam divides by
    its own root mean square into updates of about ``lr``: there any two summation
    orders part, the allreduce strategy's and one process's as well."""
    import torch

    mask = torch.zeros_like(p, dtype=torch.bool)
    if name.endswith("qkv.bias"):
        third = p.numel() // 3
        mask[third : 2 * third] = True
    return mask


def _diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The largest |a - b| of any element, the parameter holding it, and the largest
    outside the elements whose exact gradient is zero (:func:`_null_mask`)."""
    assert a.keys() == b.keys()
    worst, where, rest = 0.0, "-", 0.0
    for k in a:
        d = (a[k] - b[k]).abs()
        top = float(d.max())
        if top > worst:
            worst, where = top, k
        rest = max(rest, float(d.masked_fill(_null_mask(k, d), 0).max()))
    return {"max": worst, "at": where, "outside_null": rest}


def _rank_main(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    import torch
    import torch.distributed as dist

    torch.set_default_dtype(getattr(torch, args.dtype))  # models built after this take it
    rows: list[dict[str, Any]] = []
    for model_name in args.models:
        data = _data(model_name)
        g = torch.Generator().manual_seed(1)  # the same global batches on every rank
        batches = [
            torch.randint(0, len(data.x_train), (args.batch_size,), generator=g)
            for _ in range(args.steps)
        ]
        for optimizer in args.optimizers:
            params = {s: _train(s, model_name, optimizer, args, data, batches) for s in STRATEGIES}
            if dist.get_rank() != 0:
                continue
            one = _one_process(model_name, optimizer, args, data, batches)
            row: dict[str, Any] = {
                "model": model_name,
                "optimizer": optimizer,
                "workers": dist.get_world_size(),
                "parameters": sum(p.numel() for p in one.values()),
            }
            for s in STRATEGIES:
                row[s] = {
                    "vs_allreduce": _diff(params[s], params["allreduce"]),
                    "vs_one_process": _diff(params[s], one),
                }
            rows.append(row)
    return rows if dist.get_rank() == 0 else None


def _worst(row: dict[str, Any], key: str = "max") -> tuple[float, str]:
    """The row's largest difference (``key``: "max" or "outside_null") and its parameter."""
    return max(
        (row[s][v][key], row[s][v]["at"])
        for s in STRATEGIES
        for v in ("vs_allreduce", "vs_one_process")
    )


def run(args: argparse.Namespace) -> int:
    from disttrain.comm.errors import UsageError

    if not args.workers or min(args.workers) < 1:
        raise UsageError("--workers must list world sizes >= 1, e.g. 1,2,3,4")
    bad = [n for n in args.workers if args.batch_size % n]
    if bad:
        raise UsageError(f"--batch-size {args.batch_size} must be a multiple of --workers {bad}")
    if args.steps < 1 or args.tolerance <= 0:
        raise UsageError("--steps must be >= 1 and --tolerance > 0")
    from disttrain.launch.spawn import RankError, WorldTimeout, run_world

    rows: list[dict[str, Any]] = []
    for n in args.workers:
        try:
            got = run_world(
                _rank_main,
                n,
                (args,),
                timeout=args.timeout,
                collective_timeout=min(args.timeout, 120.0),
            )[0]
        except (RankError, WorldTimeout) as exc:
            sys.stderr.write(
                f"disttrain: error: bench zero-equivalence failed on {n} "
                f"workers: {str(exc).splitlines()[0]}\n"
            )
            return 1
        rows += got or []
    misses = _print_table(args, rows)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args) | {"bench_module": None}, "rows": rows}, fh, indent=2)
    return 1 if misses else 0


def _print_table(args: argparse.Namespace, rows: list[dict[str, Any]]) -> int:
    """One line per row: each ZeRO stage's max |Δ| against allreduce and against one
    process, and the worst outside the key biases; returns the rows over ``--tolerance``."""
    print(
        f"bench zero-equivalence: {args.steps} steps, global batch {args.batch_size}, "
        f"{args.dtype}, algorithm={args.algorithm}, lr {LR}; max |Δ| of any parameter, "
        f"tolerance {args.tolerance:g}"
    )
    head = "".join(f"{s + ' vs ar':>15}{s + ' vs 1p':>15}" for s in STRATEGIES[1:])
    print(
        f"{'model':<6}{'opt':<10}{'N':>2}{'params':>9}{'ar vs 1p':>12}{head}"
        f"{'but key bias':>14}  ok"
    )
    misses = 0
    for row in rows:
        cells = "".join(
            f"{row[s]['vs_allreduce']['max']:>15.2e}{row[s]['vs_one_process']['max']:>15.2e}"
            for s in STRATEGIES[1:]
        )
        worst, where = _worst(row)
        rest = _worst(row, "outside_null")[0]
        ok = worst <= args.tolerance
        misses += not ok
        print(
            f"{row['model']:<6}{row['optimizer']:<10}{row['workers']:>2}{row['parameters']:>9}"
            f"{row['allreduce']['vs_one_process']['max']:>12.2e}{cells}{rest:>14.2e}  "
            f"{'yes' if ok else 'MISS (' + where + ')'}"
        )
    worst, where = max((_worst(r) for r in rows), default=(0.0, "-"))
    rest = max((_worst(r, "outside_null")[0] for r in rows), default=0.0)
    print(
        f"{len(rows)} rows, {len(rows) * 3} ZeRO cells; worst {worst:.2e} ({where}), "
        f"{rest:.2e} outside the key biases; {misses} row(s) over {args.tolerance:g}"
    )
    return misses
