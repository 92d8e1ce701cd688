"""The scenario file (TOML): ``[model]``, ``[hardware]``, ``[run]``, checked key by key.

Every problem is one line naming the file, the table and the key (a UsageError: the
command ends with exit code 2). Unknown keys are refused, so a typo is not a default.
"""

from __future__ import annotations

import math
import re
from typing import Any

import tomllib

from disttrain.comm.errors import UsageError
from disttrain.lab.scenario import models
from disttrain.lab.scenario.hardware import FABRICS, INTRA_PRESETS, IntraLink
from disttrain.lab.scenario.measured import anchored
from disttrain.lab.scenario.spec import (
    GRAD_BYTES,
    Hardware,
    Measured,
    Run,
    Scenario,
    ScenarioError,
)
from disttrain.strategies.cost.base import Mesh
from disttrain.strategies.spec import parse_one

__all__ = ["ScenarioError", "load", "parse", "parse_rate", "parse_strategy", "scaled"]

_KEYS = {
    "model": {"name", "seq_len", "layers", "hidden", "heads", "vocab", "activation_checkpointing"},
    "hardware": {
        "gpus_per_node",
        "gpu_samples_per_second",
        "gpu_tflops",
        "intra_node",
        "intra_bandwidth",
        "intra_latency",
        "inter_bandwidth",
        "inter_latency",
        "inter_fabric",
        "nics_per_node",
    },
    "run": {
        "gpus",
        "batch_per_gpu",
        "global_batch",
        "accumulation",
        "precision",
        "strategy",
        "library",
        "overlap",
        "tp_overlap",
        "bucket_mb",
    },
    "measured": {"gpus", "samples_per_second", "strategy", "global_batch", "accumulation"},
}
#: tables a file must have; [measured] is optional
_REQUIRED = ("model", "hardware", "run")
#: GPT's vocabulary when the file gives none: GPT-2's 50,257 padded to 51,200, as
#: Megatron-LM pads it (Narayanan et al. 2021 use V = 51,200).
DEFAULT_VOCAB = 51200
#: PyTorch DDP's default bucket (bucket_cap_mb = 25)
DEFAULT_BUCKET_MB = 25.0
_RATE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(bit|b)(?:/s|ps)?\s*$", re.I)
_TIME = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ns|us|ms|s)\s*$", re.I)
_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_rate(text: str) -> float:
    """``100Gbit`` -> 12.5e9 bytes/s; ``25GB/s`` -> 25e9 (bit or B, decimal prefixes)."""
    m = _RATE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a rate: write e.g. 100Gbit or 25GB/s")
    unit = m.group(3)
    bits = unit.lower() == "bit" or unit == "b"  # a lower-case b is a bit, as in Gb/s
    value = float(m.group(1)) * _SCALE[m.group(2).lower()] / (8 if bits else 1)
    if value <= 0:
        raise ValueError(f"{text!r} must be above 0")
    return value


def _duration(text: str) -> float:
    m = _TIME.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a duration: write e.g. 5us or 0.2ms")
    return float(m.group(1)) * _SECONDS[m.group(2).lower()]


class _Table:
    """One table of the file; each getter checks the value's type and range."""

    def __init__(self, path: str, name: str, data: Any) -> None:
        self.path, self.name = path, name
        if not isinstance(data, dict):
            self.fail("", "must be a table")
        unknown = sorted(set(data) - _KEYS[name])
        self.data: dict[str, Any] = data
        if unknown:
            self.fail(unknown[0], f"unknown key; use one of {', '.join(sorted(_KEYS[name]))}")

    def error(self, key: str, problem: str) -> ScenarioError:
        where = f"[{self.name}] {key}" if key else f"[{self.name}]"
        return ScenarioError(f"{self.path}: {where}: {problem}")

    def fail(self, key: str, problem: str) -> None:
        raise self.error(key, problem)

    def has(self, key: str) -> bool:
        return key in self.data

    def integer(self, key: str, default: int | None = None, low: int = 1) -> int:
        value = self.data.get(key, default)
        if value is None:
            self.fail(key, "is required")
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise self.error(key, f"must be a whole number of at least {low}, got {value!r}")
        return value

    def number(self, key: str) -> float:
        if key not in self.data:
            self.fail(key, "is required")
        value = self.data[key]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or value <= 0:
            self.fail(key, f"must be a number above 0, got {value!r}")
        return float(value)

    def choice(self, key: str, choices: tuple[str, ...], default: str | None = None) -> str:
        value = self.data.get(key, default)
        if value is None:
            self.fail(key, f"is required: one of {', '.join(choices)}")
        if value not in choices:
            self.fail(key, f"{value!r} is not one of {', '.join(choices)}")
        return str(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            self.fail(key, f"must be true or false, got {value!r}")
        return bool(value)

    def text(self, key: str, parse: Any) -> float:
        value = self.data[key]
        try:
            return float(parse(str(value)) if isinstance(value, str) else _not_text(value))
        except ValueError as exc:
            self.fail(key, str(exc))
        raise AssertionError  # fail raised


def _not_text(value: Any) -> float:
    raise ValueError(f'{value!r} must be a quoted string with its unit, e.g. "100Gbit"')


def load(path: str) -> Scenario:
    """Read and check ``path``; ScenarioError (one line) on any problem."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ScenarioError(f"{path}: no such scenario file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: not valid TOML: {exc}") from None
    return parse(data, path)


def parse(data: dict[str, Any], path: str = "scenario") -> Scenario:
    extra = sorted(set(data) - set(_KEYS))
    if extra:
        raise ScenarioError(
            f"{path}: [{extra[0]}]: unknown table; use [model], [hardware], [run] (and [measured])"
        )
    for name in _REQUIRED:
        if name not in data:
            raise ScenarioError(f"{path}: [{name}]: the table is missing")
    model_t, hw_t, run_t = (_Table(path, n, data[n]) for n in _REQUIRED)
    model, ckpt = _model(model_t)
    hardware = _hardware(hw_t, "measured" in data)
    run = _run(run_t, hardware, model)
    measured = None
    if "measured" in data:
        table = _Table(path, "measured", data["measured"])
        measured = _measured(table, run_t, run, hardware, model)
    for r in (run, *([measured.run] if measured else [])):
        if r.gpus > hardware.gpus_per_node and hardware.inter_bandwidth <= 0:
            hw_t.fail("inter_bandwidth", f"is required: {r.gpus} GPUs span more than one node")
    return anchored(Scenario(model, ckpt, hardware, run, measured), path)


def _model(t: _Table) -> tuple[models.ModelShape, bool]:
    name = t.choice("name", models.MODEL_NAMES)
    ckpt = t.flag("activation_checkpointing", False)
    if name == "gpt":
        layers, hidden = t.integer("layers"), t.integer("hidden")
        heads, seq = t.integer("heads"), t.integer("seq_len")
        if hidden % heads:
            t.fail("heads", f"{heads} does not divide hidden {hidden}")
        vocab = t.integer("vocab", DEFAULT_VOCAB)
        return models.build(name, seq_len=seq, layers=layers, hidden=hidden, vocab=vocab), ckpt
    allowed = {"name", "activation_checkpointing"} | (
        {"seq_len"} if name.startswith("bert") else set()
    )
    for key in sorted(set(t.data) - allowed):
        t.fail(key, f"is not a setting of {name}")
    if name.startswith("bert"):
        seq = t.integer("seq_len", 128)
        if seq > 512:
            t.fail("seq_len", f"{seq}: BERT has 512 positions")
        return models.build(name, seq_len=seq), ckpt
    return models.build(name), ckpt


def _intra(t: _Table) -> IntraLink:
    if t.has("intra_node") == t.has("intra_bandwidth"):
        t.fail("intra_node", "give either intra_node (a preset) or intra_bandwidth, not both")
    if t.has("intra_node"):
        preset = INTRA_PRESETS[t.choice("intra_node", tuple(INTRA_PRESETS))]
        if t.has("intra_latency"):
            t.fail("intra_latency", "goes with intra_bandwidth; a preset has its own")
        return preset
    bandwidth = t.text("intra_bandwidth", parse_rate)
    latency = t.text("intra_latency", _duration) if t.has("intra_latency") else 2e-6
    return IntraLink(bandwidth, latency, "from the scenario file")


def _hardware(t: _Table, measured: bool) -> Hardware:
    per_node = t.integer("gpus_per_node")
    given = [k for k in ("gpu_samples_per_second", "gpu_tflops") if t.has(k)]
    if measured and given:
        t.fail(given[0], "is backed out of [measured]: give one or the other")
    if not measured and len(given) != 1:
        t.fail(
            "gpu_tflops",
            "give either gpu_samples_per_second or gpu_tflops (one of them), or a [measured] run",
        )
    rate = t.number("gpu_samples_per_second") if t.has("gpu_samples_per_second") else None
    tflops = t.number("gpu_tflops") if t.has("gpu_tflops") else None
    intra = _intra(t)
    inter = t.text("inter_bandwidth", parse_rate) if t.has("inter_bandwidth") else 0.0
    fabric = "none"
    if inter > 0:
        fabric = t.choice("inter_fabric", tuple(FABRICS))
    elif t.has("inter_fabric") or t.has("inter_latency"):
        t.fail("inter_bandwidth", "is required with inter_fabric or inter_latency")
    spec = FABRICS.get(fabric)
    latency = t.text("inter_latency", _duration) if t.has("inter_latency") else 0.0
    if spec is not None and not t.has("inter_latency"):
        latency = spec.latency
    return Hardware(
        gpus_per_node=per_node,
        gpu_samples_per_second=rate,
        gpu_tflops=tflops,
        intra=intra,
        inter_bandwidth=inter,
        inter_latency=latency,
        inter_fabric=fabric,
        inter_efficiency=spec.efficiency if spec is not None else 1.0,
        nics_per_node=t.integer("nics_per_node", 1),
    )


def _measured(
    t: _Table, run_t: _Table, run: Run, hw: Hardware, model: models.ModelShape
) -> Measured:
    """The timed run: [run] with [measured]'s GPU count (and strategy; a hybrid layout
    scales its data-parallel part by default), the same batch per GPU, and [run]'s
    accumulation unless [measured] gives its own global batch or accumulation."""
    gpus = t.integer("gpus")
    strategy = str(t.data.get("strategy", run.strategy))
    if "strategy" not in t.data:
        try:
            strategy = scaled(run.strategy, gpus)
        except ValueError as exc:
            t.fail("gpus", f"{exc}; give strategy")
    timed = dict(run_t.data, gpus=gpus, strategy=strategy, batch_per_gpu=run.batch_per_gpu)
    for key in ("global_batch", "accumulation"):  # [run]'s, which need not fit its GPUs
        timed.pop(key, None)
    # the timed run's own batch (a global batch kept fixed), else [run]'s accumulation
    own = {k: t.data[k] for k in ("global_batch", "accumulation") if k in t.data}
    timed.update(own or {"accumulation": run.accumulation})
    try:
        timed_run = _run(_Table(t.path, "run", timed), hw, model)
    except ScenarioError as exc:  # name the table the user wrote: "PATH: [run] KEY: PROBLEM"
        where, problem = str(exc).removeprefix(f"{t.path}: ").split(": ", 1)
        key = where.split(" ")[-1]
        if key not in t.data:  # [run]'s value, at [measured]'s GPU count
            key = "gpus"
        raise t.error(key, problem.replace("run.gpus", "[measured] gpus")) from None
    return Measured(timed_run, t.number("samples_per_second"))


def parse_strategy(text: str, gpus: int) -> Mesh:
    """The mesh a scenario's ``strategy`` makes on ``gpus`` GPUs; ValueError (one line) else.

    ``strategy`` is a run spec of ``disttrain compare``/``advise`` (``strategies.spec``:
    ``strategy[:value][:key=value...]``); the strategy's cost part makes the mesh
    (``StrategyCost.mesh``), so the names and settings are the strategies' own:
    ``allreduce``; ``zero:S`` (``--zero-stage``, 1-3); ``tensor`` (T = G) and
    ``pipeline`` (P = G); ``hybrid:tp=T:pp=P[:dp=D][:virtual_stages=V]`` (``--tp``,
    ``--pp``, ``--dp``, ``--virtual-stages``; D unstated: G / (T·P)). Fewer slices or
    stages than GPUs, replicated (the grammar before this one's ``tensor:T``,
    ``pipeline:P``), are ``hybrid:tp=T``, ``hybrid:pp=P``; its ``hybrid:dp=D,tp=T,pp=P,vp=V``
    is ``hybrid:tp=T:pp=P:dp=D:virtual_stages=V``.
    """
    from disttrain.strategies.base import STRATEGIES

    try:
        spec = parse_one(text)
        return STRATEGIES.get(spec.strategy).cost_model().mesh(spec.settings, gpus)
    except (UsageError, ValueError) as exc:
        why = str(exc).removeprefix(f"--strategies {text.strip()!r}: ")
        raise ValueError(
            f"{text!r}: {why.removeprefix(f'--strategy {text.strip()!r}: ')}"
        ) from None


def scaled(text: str, gpus: int) -> str:
    """``text`` on ``gpus`` GPUs, its data-parallel part scaled: a stated ``dp=D`` restated
    for them (the mesh's other settings kept), else ``text`` itself (an unstated D is
    G / (T·P) at any G); ValueError where the rest of the mesh does not fit them."""
    parts = text.split(":")
    at = [i for i, p in enumerate(parts) if p.partition("=")[0].strip().lstrip("-") == "dp"]
    if not at:
        return text
    rest = ":".join(p for i, p in enumerate(parts) if i != at[0])
    try:
        parts[at[0]] = f"dp={parse_strategy(rest, gpus).dp}"
    except ValueError as exc:  # named as written
        raise ValueError(f"{text!r}: {str(exc).removeprefix(f'{rest!r}: ')}") from None
    return ":".join(parts)


def _batch(t: _Table, dp: int) -> tuple[int, int]:
    """(batch per GPU, accumulation) from batch_per_gpu and/or global_batch."""
    if not t.has("batch_per_gpu") and not t.has("global_batch"):
        t.fail("batch_per_gpu", "give batch_per_gpu or global_batch")
    acc = t.integer("accumulation", 1)
    if not t.has("global_batch"):
        return t.integer("batch_per_gpu"), acc
    total = t.integer("global_batch")
    if not t.has("batch_per_gpu"):
        if total % (dp * acc):
            t.fail(
                "global_batch", f"{total} is not a multiple of {dp} replicas x {acc} accumulation"
            )
        return total // (dp * acc), acc
    b = t.integer("batch_per_gpu")
    if total % (b * dp):
        t.fail("global_batch", f"{total} is not a multiple of batch_per_gpu {b} x {dp} replicas")
    if t.has("accumulation") and total != b * dp * acc:
        t.fail(
            "accumulation",
            f"{acc} disagrees with global_batch {total} = {b} x {dp} x {total // (b * dp)}",
        )
    return b, total // (b * dp)


def _run(t: _Table, hw: Hardware, model: models.ModelShape) -> Run:
    gpus = t.integer("gpus")
    strategy = str(t.data.get("strategy", "allreduce"))
    try:
        dp, tp, pp, vp, zero = parse_strategy(strategy, gpus)
    except ValueError as exc:
        t.fail("strategy", str(exc))
    if tp > 1 and not model.transformer:
        t.fail("strategy", f"tensor parallelism is modelled for bert and gpt, not {model.name}")
    stages = model.blocks if model.transformer else len(model.layers)
    if pp * vp > stages:
        t.fail("strategy", f"{pp * vp} pipeline stages for {stages} layers of {model.name}")
    if gpus % hw.gpus_per_node and gpus > hw.gpus_per_node:
        t.fail("gpus", f"{gpus} is not a multiple of gpus_per_node {hw.gpus_per_node}")
    b, acc = _batch(t, dp)
    bucket = t.number("bucket_mb") if t.has("bucket_mb") else DEFAULT_BUCKET_MB
    return Run(
        gpus=gpus,
        batch_per_gpu=b,
        accumulation=acc,
        precision=t.choice("precision", tuple(GRAD_BYTES), "fp32"),
        strategy=strategy,
        dp=dp,
        tp=tp,
        pp=pp,
        vp=vp,
        zero=zero,
        library=t.choice("library", ("nccl", "gloo", "mpi"), "nccl"),
        overlap=t.flag("overlap", True),
        tp_overlap=t.flag("tp_overlap", False),
        bucket_bytes=bucket * 1e6,
    )
