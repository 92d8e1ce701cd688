"""``disttrain advise``: strategies ranked by predicted step time for a model, nodes and network.

    disttrain advise --params 25M --nodes 256 --bandwidth 25Gbit --latency 5us
    disttrain advise --params 6.4M --nodes 4 --bandwidth 100mbit --batch-size 64
    disttrain advise --calibrate                 # fit α, β, γ and compute rates here
    disttrain advise --params 25M --nodes 64 --calibration my.json

The model is :mod:`disttrain.lab.costmodel`; its constants come from
``--calibration FILE`` or, when it exists, the default file that ``--calibrate``
writes (``~/.cache/disttrain/calibration.json``, under ``$XDG_CACHE_HOME`` if set),
else from built-in defaults (the table says which). Flags override the file:
``--bandwidth``/``--latency`` set β and α (else the calibrated loopback link),
``--flops`` sets a node's compute rate.

``--strategies`` is written in the spec grammar of ``disttrain compare``
(:mod:`disttrain.strategies.spec`): ``allreduce:ring``, ``ps:async:servers=4``,
``localsgd:8:algorithm=ring``, ``decentralized:topk:0.01``; a spec's settings
override the flags for its row; one-bit's share of entries sent is stated
(``decentralized:onebit:density=0.01``), since τ does not give it.

Each row also gives the memory one worker holds (each strategy's ``predict_memory``:
parameters, gradients, ``--optimizer`` state, ZeRO stage 3's gathered layers and
``--precision``'s weight copies) for ``--params`` as ``--layers`` equal layers, or for
``--model NAME``'s real layers; the rows of strategies whose step is not modelled
(pipeline, tensor) follow, memory only. ``--memory-per-worker 2GB`` marks which fit,
and the recommendation picks among those.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from dataclasses import asdict, replace
from typing import Any

from disttrain.comm.errors import UsageError
from disttrain.config import TrainConfig
from disttrain.costing import CAST_BYTES, STATE_COPIES
from disttrain.lab import costmodel
from disttrain.lab.calibration import DEFAULT_PATH, Calibration
from disttrain.strategies.spec import RunSpec, parse_one, parse_specs
from disttrain.units import human_bytes

__all__ = ["add_arguments", "parse_bytes", "parse_count", "parse_duration", "recommendation", "run"]

_COUNT = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:e(\d+))?\s*([kmgbt]?)\s*$", re.I)
_SCALE = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9, "t": 1e12}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ns|us|µs|ms|s)\s*$", re.I)
_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
_GRAD_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
_BYTES = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?)b\s*$", re.I)
_POWER = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_count(text: str, flag: str) -> float:
    """``25M`` -> 25e6 (decimal: K, M, G or B, T); UsageError naming ``flag`` otherwise."""
    m = _COUNT.match(text)
    if not m:
        raise UsageError(f"{flag} {text!r} is not a count: write e.g. 25M, 1.5B, 350K")
    value = float(m.group(1)) * 10 ** int(m.group(2) or 0) * _SCALE[m.group(3).lower()]
    if not 0 < value < 1e18:
        raise UsageError(f"{flag} {text!r} must be above 0")
    return value


def parse_duration(text: str, flag: str) -> float:
    """``5us`` -> 5e-6 seconds (ns, us, ms, s); UsageError naming ``flag`` otherwise."""
    m = _DURATION.match(text)
    if not m:
        raise UsageError(f"{flag} {text!r} is not a duration: write e.g. 5us, 0.2ms, 1s")
    value = float(m.group(1)) * _SECONDS[m.group(2).lower()]
    if value > 60:
        raise UsageError(f"{flag} {text!r} is more than a minute")
    return value


def parse_bytes(text: str, flag: str) -> int:
    """``2GB`` -> 2e9, ``2GiB`` -> 2·2^30 (B, KB, MB, GB, TB; KiB ... TiB); UsageError else."""
    m = _BYTES.match(text)
    if not m:
        raise UsageError(f"{flag} {text!r} is not a size: write e.g. 2GB, 512MB, 1.5GiB")
    base = 1024 if m.group(3) else 1000
    value = float(m.group(1)) * base ** _POWER[m.group(2).lower()]
    if value < 1:
        raise UsageError(f"{flag} {text!r} must be above 0")
    return int(value)


#: ``1.23 GB`` (decimal units, as --memory-per-worker reads them): the one formatter
size = human_bytes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Rank the strategies for a model of --params parameters on --nodes nodes linked at "
        "--bandwidth, by the α-β cost model calibrated on this machine (--calibrate measures "
        "it), with the memory each holds per worker (--memory-per-worker: which fit); ends "
        "with a one-line recommendation. See docs/lab.md."
    )
    _add_model_arguments(parser)
    _add_cluster_arguments(parser)
    parser.add_argument(
        "--strategies",
        default="",
        help="comma-separated strategy[:value][:key=value...], the grammar of compare "
        "(default: each strategy's own rows)",
    )
    parser.add_argument(
        "--calibration", default="", help=f"constants file (default {DEFAULT_PATH})"
    )
    parser.add_argument("--calibrate", action="store_true", help="measure this machine, save")
    parser.add_argument("--workers", type=int, default=4, help="--calibrate: most local ranks")
    parser.add_argument("--json", dest="json_path", default="", help="also write the rows here")
    parser.add_argument(
        "--scenario",
        default="",
        metavar="FILE.toml",
        help="predict one published-style cluster run described in FILE.toml "
        "(docs/lab.md, 'Scenario files'); --json writes the prediction",
    )


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """What is trained: the model (by size or by name), its optimizer, precision, memory cap."""
    parser.add_argument(
        "--params", help="model parameters, e.g. 25M (required unless --model or --calibrate)"
    )
    parser.add_argument(
        "--model",
        help="instead of --params: a train --model (mlp, cnn, gpt, "
        "module:function), its real layers, shaped for --dataset",
    )
    parser.add_argument(
        "--dataset", help="with --model: the data set it is shaped for (default digits)"
    )
    parser.add_argument(
        "--layers",
        type=int,
        help="with --params: the model as this many "
        "equal layers (default 10), for stage 3's gathers and stage splits",
    )
    parser.add_argument(
        "--optimizer",
        default=TrainConfig.optimizer,
        choices=sorted(STATE_COPIES),
        help=f"its state counts in memory (default {TrainConfig.optimizer}, as train)",
    )
    parser.add_argument(
        "--precision",
        default="fp32",
        choices=sorted(CAST_BYTES),
        help="bf16/fp16 add autocast's weight copies (2 bytes each) to memory",
    )
    parser.add_argument(
        "--memory-per-worker",
        metavar="SIZE",
        help="e.g. 2GB: mark the rows that fit; recommend only among them",
    )


def _add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """Where it is trained: nodes, their link and flops, the batch, buckets, parameter servers."""
    parser.add_argument("--nodes", default="256", help="data-parallel ranks, 1 to 10,000")
    parser.add_argument("--bandwidth", help="each node's link, e.g. 25Gbit, 100mbit")
    parser.add_argument(
        "--latency",
        help="per-message latency, e.g. 5us (default: 0 if only "
        "--bandwidth is given, else the calibrated α)",
    )
    parser.add_argument("--batch-size", help="GLOBAL batch (default: 32 per node)")
    parser.add_argument(
        "--model-flops", help="forward+backward flops per sample (default 6·params)"
    )
    parser.add_argument("--flops", help="a node's sustained flop/s, e.g. 20T (default: calibrated)")
    parser.add_argument("--fusion-mb", type=float, default=4.0, help="bucket size (default 4)")
    parser.add_argument(
        "--overlap",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="buckets overlap backward (default: on, as in train)",
    )
    parser.add_argument("--grad-dtype", default="fp32", choices=sorted(_GRAD_BYTES))
    parser.add_argument("--servers", type=int, default=1, help="parameter servers (ps:*)")


def _calibration(args: argparse.Namespace) -> Calibration:
    path = args.calibration or (DEFAULT_PATH if os.path.exists(DEFAULT_PATH) else "")
    if not path:
        return Calibration.defaults()
    try:
        return Calibration.load(path)
    except ValueError as exc:
        raise UsageError(f"--calibration: {exc}") from None


def _network(args: argparse.Namespace, cal: Calibration) -> costmodel.Network:
    """The flags' link; what is not given comes from the calibration (its n=2 link fit)."""
    from disttrain.cluster.netns import parse_rate

    beta = cal.beta if args.bandwidth is None else 8 / parse_rate(args.bandwidth)
    if args.latency is not None:
        alpha = parse_duration(args.latency, "--latency")
    else:  # a bandwidth alone: an ideal zero-latency link, as the table's title says
        alpha = cal.alpha if args.bandwidth is None else 0.0
    name = "calibrated link" if args.bandwidth is None and args.latency is None else "flags"
    return costmodel.Network(alpha, beta, name=name)


def _model(args: argparse.Namespace, nodes: int) -> tuple[int, Any]:
    """(Ψ, the model whose layers the memory formulas split): ``--model`` built on the meta
    device (shapes only), or ``--params`` as ``--layers`` equal layers."""
    if args.model is None:
        if args.dataset is not None:
            raise UsageError("--dataset shapes --model: give --model too, or leave it out")
        if args.params is None:
            raise UsageError("--params is required (e.g. --params 25M), or --model, or --calibrate")
        layers = 10 if args.layers is None else args.layers
        if not 1 <= layers <= 100_000:
            raise UsageError(f"--layers {layers}: from 1 to 100,000")
        params = int(parse_count(args.params, "--params"))
        return params, costmodel.equal_layers(params, layers, nodes)
    if args.params is not None or args.layers is not None:
        given = "--params" if args.params is not None else "--layers"
        raise UsageError(f"{given} and --model are alternatives: --model counts its own")
    import torch

    from disttrain.data import load_dataset
    from disttrain.models import build_model

    data = load_dataset(args.dataset or "digits")
    with torch.device("meta"):
        model = build_model(args.model, data)
    return sum(p.numel() for p in model.parameters()), model


def _inputs(args: argparse.Namespace) -> tuple[costmodel.Workload, int, list[RunSpec], Any]:
    nodes_f = parse_count(args.nodes, "--nodes")
    nodes = int(nodes_f)
    if nodes != nodes_f or not 1 <= nodes <= 10_000:
        raise UsageError(f"--nodes {args.nodes!r}: a whole number from 1 to 10,000")
    params, model = _model(args, nodes)
    batch = int(parse_count(args.batch_size, "--batch-size")) if args.batch_size else 32 * nodes
    if batch < nodes:
        raise UsageError(f"--batch-size {batch} is smaller than --nodes {nodes}")
    if not 0 <= args.fusion_mb <= 1e6 or math.isnan(args.fusion_mb):
        raise UsageError(f"--fusion-mb {args.fusion_mb}: use 0 (off) or a size in MB")
    if args.servers < 1:
        raise UsageError(f"--servers {args.servers}: at least 1")
    flops = parse_count(args.model_flops, "--model-flops") if args.model_flops else None
    work = costmodel.Workload(
        params=params,
        batch_size=batch,
        bytes_per_param=_GRAD_BYTES[args.grad_dtype],
        flops_per_sample=flops,
        bucket_bytes=int(args.fusion_mb * (1 << 20)),
        overlap=args.overlap,
        servers=args.servers,
        optimizer=args.optimizer,
        precision=args.precision,
        shapes=tuple(tuple(p.shape) for p in model.parameters() if p.requires_grad),
    )
    if args.strategies.strip():
        return work, nodes, parse_specs(args.strategies, model=True), model
    names = (*costmodel.default_strategies(), *costmodel.memory_strategies())
    return work, nodes, [parse_one(s, model=True) for s in names], model


#: advise's columns, the first dropped first when the terminal is too narrow for all
_DROP_ORDER = ("compute ms", "samples/s", "MB/rank/step", "#", "efficiency", "why")


def count(n: float) -> str:
    """A parameter count as --params takes it: 1.5B, 25M, 867K."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.4g}{unit}"
    return f"{n:.0f}"


def _lines_at_colons(label: str, width: int) -> str:
    """A long spec cut after its colons into lines of at most ``width`` (a part longer than
    that stays whole): ``decentralized:onebit:`` / ``density=0.01``, never ``density=0`` /
    ``.01``."""
    lines = [""]
    for part in label.split(":"):
        piece = part if not lines[-1] else f":{part}"
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines[-1] += ":"
            lines.append(part)
        else:
            lines[-1] += piece
    return "\n".join(lines)


def fixed(value: float) -> str:
    """A figure in fixed point, never in scientific notation: 29,310 / 14.2 / 6.56 / 0.568."""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}" if value else "0"


def _table(rows: list[costmodel.Row], title: str, caption: str) -> None:
    """The ranked rows, as wide as the terminal ($COLUMNS; 80 when not a terminal): figures
    never wrap; "why" wraps in what is left, and the least needed columns go first."""
    from rich.console import Console
    from rich.table import Table

    cells = []
    for i, r in enumerate(rows, 1):
        p, m = r.step, r.memory
        cell = {"#": str(i), "strategy": _lines_at_colons(r.label, 30)}
        if p is not None:
            cell.update(
                {
                    "step ms": fixed(p.step_seconds * 1e3),
                    "compute ms": fixed(p.compute_seconds * 1e3),
                    "comm ms": fixed(p.comm_seconds * 1e3),
                    "MB/rank/step": fixed(p.bytes_per_rank / 1e6),
                    "efficiency": f"{p.efficiency:.0%}",
                    "samples/s": fixed(p.samples_per_second),
                }
            )
        cell["memory/worker"] = size(m.total) if m is not None else "-"
        if r.fits is not None:
            cell["fits"] = "yes" if r.fits else "no"
        notes = [p.reason + (f" ({p.note})" if p.note else "")] if p is not None else []
        cell["why"] = "; ".join(filter(None, [*notes, r.why, m.note if m else ""]))
        cells.append(cell)
    console = Console(emoji=False)  # a label like allreduce:ring:... is not :ring: (an emoji)
    cols = list(dict.fromkeys(k for c in cells for k in c)) if cells else []
    cols.sort(key=lambda c: c == "why")  # the reasons last

    def width(col: str) -> int:  # a cell's text, its padding and one border
        if col in ("why", "strategy"):
            return 24 if col == "why" else 33  # a long spec folds at 30
        return max(len(col), *(len(c.get(col, "-")) for c in cells)) + 3

    for drop in _DROP_ORDER:
        if sum(width(c) for c in cols) + 1 <= console.width:
            break
        if drop in cols:
            cols.remove(drop)
    table = Table(title=title, caption=caption)
    for col in cols:
        if col == "why":
            table.add_column(col, ratio=1, min_width=12)
        elif col == "strategy":
            table.add_column(col, max_width=30, overflow="fold")
        else:
            table.add_column(col, justify="right", no_wrap=True, min_width=len(col))
    for c in cells:
        table.add_row(*(c.get(col, "-") for col in cols))
    console.print(table)
    if "why" not in cols:  # too narrow for the reasons: each "-" still gets its own
        for c in cells:
            if any(c.get(col, "-") == "-" for col in cols):
                label = c["strategy"].replace("\n", "")  # as written, not cut at its colons
                console.print(f"  {label}: {c['why'] or 'not modelled'}")


def recommendation(
    rows: list[costmodel.Row],
    work: costmodel.Workload,
    net: costmodel.Network,
    limit: int | None = None,
) -> str:
    """The closing line: the fastest row (among those that fit), why, and by how much it
    beats the next; or that none fits."""
    within = f" in {size(limit)} per worker" if limit is not None else ""
    preds = [r.step for r in costmodel.fitting(rows) if r.step is not None]
    if not preds:
        fit = [r.label for r in rows if r.fits]
        if fit:  # memory alone fits
            one = len(fit) == 1
            return (
                f"recommendation: only {', '.join(fit)} {'fits' if one else 'fit'}{within}, "
                f"and {'its' if one else 'their'} step time is not modelled"
            )
        held = [r for r in rows if r.memory is not None]
        if limit is None or not held:
            return "recommendation: none of the strategies listed has a modelled step time"
        least = min(held, key=lambda r: r.memory.total if r.memory else 0.0)
        assert least.memory is not None
        return (
            f"recommendation: none of the {len(rows)} strategies fits{within}; the "
            f"least memory is {least.label}'s {size(least.memory.total)}"
        )
    best = preds[0]
    line = (
        f"recommendation: for {count(work.params)} parameters on {best.nodes} nodes at "
        f"{8 / net.beta / 1e9:.4g} Gbit/s{within}: {best.strategy} "
        f"({fixed(best.step_seconds * 1e3)} ms a step, {best.efficiency:.0%} efficiency)"
    )
    if len(preds) > 1 and preds[1].step_seconds > 0:
        ratio = preds[1].step_seconds / max(best.step_seconds, 1e-12)
        line += f", {ratio:.2f}x as fast as the next ({preds[1].strategy})"
    return line + f", because {best.reason}"


def _json_row(r: costmodel.Row) -> dict[str, Any]:
    out: dict[str, Any] = (
        asdict(r.step)
        if r.step is not None
        else {"strategy": r.label, "step_seconds": None, "reason": r.why}
    )
    out["memory"] = None if r.memory is None else {**asdict(r.memory), "total": r.memory.total}
    out["fits"] = r.fits
    return out


def _scenario_alone(args: argparse.Namespace) -> None:
    """``--scenario`` describes the whole run: any model or cluster flag given beside it
    would be silently unread, so it is refused (one line, exit 2)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    defaults = vars(parser.parse_args([]))
    given = [
        name
        for name, value in vars(args).items()
        if name in defaults and name not in ("scenario", "json_path") and value != defaults[name]
    ]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise UsageError(f"{flag} is not read with --scenario: the file describes the whole run")


def run(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    del argv
    if args.scenario:  # a described cluster: its own self-contained model
        from disttrain.lab.scenario import command

        _scenario_alone(args)
        return command.run(args.scenario, args.json_path)
    if args.calibrate:
        from disttrain.lab import calibrate

        if not 2 <= args.workers <= 8:
            raise UsageError(f"--workers {args.workers}: calibrate with 2 to 8 local ranks")
        path = args.calibration or DEFAULT_PATH
        cal = calibrate.calibrate(args.workers)
        cal.save(path)
        print(calibrate.describe(cal))
        print(f"saved to {path}")
        return 0
    cal = _calibration(args)
    limit = None
    if args.memory_per_worker is not None:
        limit = parse_bytes(args.memory_per_worker, "--memory-per-worker")
    work, nodes, specs, model = _inputs(args)
    net = _network(args, cal)
    if args.flops:
        cal = replace(cal, seconds_per_flop=1 / parse_count(args.flops, "--flops"))
    try:
        rows = costmodel.assess(specs, work, nodes, net, cal, model, limit)
    except ValueError as exc:
        raise UsageError(f"--strategies: {exc}") from None
    title = (
        f"{count(work.params)} parameters, {nodes} nodes, global batch "
        f"{work.batch_size}, α {net.alpha * 1e6:.3g} us, "
        f"{8 / net.beta / 1e9:.4g} Gbit/s, buckets {args.fusion_mb:g} MB, "
        f"{work.optimizer}, {work.precision}"
    )
    _table(rows, title, f"constants: {cal.source}")
    print(recommendation(rows, work, net, limit))
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(
                {
                    "network": asdict(net),
                    "workload": asdict(work),
                    "nodes": nodes,
                    "calibration": cal.source,
                    "memory_per_worker": limit,
                    "rows": [_json_row(r) for r in rows],
                },
                fh,
                indent=1,
            )
    return 0
