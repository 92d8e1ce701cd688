"""Run settings: frozen dataclasses whose fields are both the CLI flags and the TOML keys.

Each field's metadata carries its help text (and choices); :mod:`disttrain.cli`
builds the ``train`` parser from these dataclasses, and a ``--config FILE.toml``
may set any field by the same name (dashes or underscores). Precedence:
defaults < TOML file < flags. Components with settings of their own add a
section dataclass to :data:`SECTIONS`; its fields join the same flat namespace.

Ownership: every setting belongs to exactly one section. The sections every run
reads (``ALWAYS_READ = True``: :class:`TrainConfig`, what and how to train, and
:class:`DataConfig`) are read by the trainer and launcher whatever the strategy;
a field of theirs marked ``opt(..., always_read=False)`` (``--algorithm``) and the
fields of every other section are read only by the components that declare them
(``StrategySettings.reads_settings``). Pre-flight refuses a setting changed from its
default that no chosen component reads (:mod:`disttrain.launch.preflight`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, ClassVar

from disttrain.comm.errors import UsageError
from disttrain.registry import by_flag

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "SECTIONS",
    "DataConfig",
    "RunConfig",
    "TrainConfig",
    "always_read",
    "cache_dir",
    "changed_settings",
    "choice_defaults",
    "field_names",
    "flag",
    "load",
    "opt",
    "register_section",
    "section_fields",
]


def opt(default: Any, help: str, choices: tuple[str, ...] | None = None, **meta: Any) -> Any:
    """A dataclass field that is also a CLI flag and a TOML key."""
    return field(default=default, metadata={"help": help, "choices": choices, **meta})


#: each ``--optimizer``'s learning rate when ``--lr`` is not given (next to its choices,
#: since this module cannot import the trainer): ``--lr``'s 0.05 is SGD's, and Adam at 0.05
#: does not train (the README's ZeRO + adam example ended at 0.19 accuracy); 1e-3 is
#: Kingma & Ba's default. A strategy's or compressor's own lr comes first.
OPTIMIZER_LR = {"sgd": 0.05, "momentum": 0.05, "adam": 0.001}


@dataclass(frozen=True)
class TrainConfig:
    """What to train, with how many workers, and where the results go (read by every run)."""

    ALWAYS_READ: ClassVar[bool] = True
    TITLE: ClassVar[str] = "run"
    #: ``train --help`` groups these fields under their own titles (the rest under TITLE).
    GROUPS: ClassVar[dict[str, tuple[str, ...]]] = {
        "model": ("model", "compile"),
        "optimizer and learning rate": (
            "lr",
            "optimizer",
            "momentum",
            "weight_decay",
            "lr_scaling",
            "base_batch_size",
            "warmup_epochs",
            "lr_schedule",
            "lr_gamma",
            "lr_step_epochs",
        ),
        "precision": (
            "precision",
            "loss_scale",
            "scale_growth",
            "scale_backoff",
            "scale_growth_interval",
            "max_skipped_steps",
        ),
        "reliability: faults, checks, checkpoints, restarts": (
            "timeout",
            "check_collectives",
            "inject_fault",
            "check_finite",
            "checkpoint_every",
            "resume",
            "max_restarts",
            "overwrite",
            "min_workers",
            "max_workers",
            "join",
            "heartbeat_timeout",
        ),
        "data loading": ("prefetch", "loader_delay_ms"),
        "multi-node (torchrun's meaning)": ("nnodes", "node_rank", "rdzv_endpoint", "rdzv_id"),
    }

    workers: int = opt(2, "worker processes on this node")
    strategy: str = opt("allreduce", "how replicas agree (each one's settings: a group below)")
    # read only by the strategies that average with a collective (they declare it)
    # (the data-parallel strategies default it to ``auto``: their ``setting_defaults``)
    algorithm: str = opt(
        "native",
        "allreduce algorithm (the data-parallel strategies default to auto: the cost model's "
        "pick per message size; the others to native, the backend's own)",
        always_read=False,
    )
    model: str = opt(
        "mlp",
        "mlp, cnn, gpt, gpt2-small, or package.module:function (or path/file.py:function) "
        "returning an nn.Module",
    )
    epochs: int = opt(10, "passes over the training set")
    max_steps: int = opt(0, "stop after this many steps (0: run all epochs)")
    batch_size: int = opt(64, "GLOBAL batch size, split evenly across data-parallel workers")
    lr: float = opt(
        0.05,
        "learning rate (default: the optimizer's: "
        + ", ".join(f"{name} {lr:g}" for name, lr in OPTIMIZER_LR.items())
        + ")",
    )
    optimizer: str = opt("momentum", "optimizer", tuple(OPTIMIZER_LR))
    momentum: float = opt(0.9, "momentum factor for --optimizer momentum")
    weight_decay: float = opt(0.0, "L2 weight decay")
    seed: int = opt(0, "seed for the data order, the model's initial weights and dropout")
    out: str = opt("", "output folder (default: a new folder under runs/)")
    device: str = opt(
        "cpu",
        "cpu (gloo) or cuda (NCCL; refused until a GPU run proves it: docs/gpu.md)",
        ("cpu", "cuda"),
    )
    backend: str = opt(
        "auto",
        "collectives: auto (gloo on cpu, NCCL on cuda) or gloo (with --device cuda: the ranks "
        "of a host may share one GPU; point-to-point messages are staged through host memory)",
        ("auto", "gloo"),
    )
    timeout: float = opt(60.0, "seconds any collective may wait before the job fails")
    check_collectives: bool = opt(
        False, "check each allreduce's length on all ranks first (one small extra collective)"
    )
    threads: int = opt(1, "intra-op threads per worker")
    compile: str = opt(
        "none",
        "torch.compile each worker's model forward (and its backward) with this backend: "
        "inductor (torch's compiler) or aot_eager (traced, no code generated); docs/training.md",
        ("none", "inductor", "aot_eager"),
    )
    log_every: int = opt(1, "write a metrics.jsonl line every N steps")
    progress: bool = opt(True, "show a live progress bar on rank 0")
    inject_fault: str = opt("", "fault for tests and demos, e.g. kill:rank=1:step=5 (see docs)")
    check_finite: bool = opt(
        True, "stop a worker whose own gradients hold NaN/Inf, naming it (one pass a step)"
    )
    # mixed precision (docs/training.md); the loss-scaler defaults are PyTorch GradScaler's
    precision: str = opt("fp32", "arithmetic precision (autocast)", ("fp32", "bf16", "fp16"))
    loss_scale: float = opt(2.0**16, "fp16: initial loss scale")
    scale_growth: float = opt(2.0, "fp16: loss scale growth factor")
    scale_backoff: float = opt(0.5, "fp16: loss scale factor after an overflow")
    scale_growth_interval: int = opt(2000, "fp16: clean steps before the scale grows")
    max_skipped_steps: int = opt(50, "fp16: overflowing steps in a row that end the run")
    # learning-rate rules for large batches (named lr-schedule: --schedule is the pipeline's)
    lr_scaling: str = opt("none", "scale --lr by batch/--base-batch-size", ("none", "linear"))
    base_batch_size: int = opt(64, "the batch size --lr is meant for, for --lr-scaling linear")
    warmup_epochs: float = opt(0.0, "epochs of linear learning-rate warm-up")
    lr_schedule: str = opt(
        "constant", "decay after warm-up", ("constant", "cosine", "exponential", "step")
    )
    lr_gamma: float = opt(0.0, "decay factor (0: 0.9 per epoch for exponential, 0.1 for step)")
    lr_step_epochs: int = opt(30, "epochs between decays for --lr-schedule step")
    # data loading
    prefetch: int = opt(2, "batches prepared ahead by a background thread (0: off)")
    loader_delay_ms: float = opt(0.0, "extra time per batch in the loader (benchmarks)")
    pin_cpus: bool = opt(False, "pin each worker to one CPU (local rank mod the CPUs allowed)")
    timeline: str = opt("", "write every rank's Chrome-trace/Perfetto timeline to this .json file")
    tensorboard: str = opt("", "write TensorBoard event files (every scalar of the run) here")
    # checkpoints and restarts (docs/reliability.md)
    checkpoint_every: int = opt(0, "save a checkpoint every N steps under --out (0: never)")
    resume: str = opt("", "resume from the newest checkpoint of this earlier run's --out")
    async_checkpoint: bool = opt(
        False, "write checkpoints in a background thread while training goes on"
    )
    max_restarts: int = opt(0, "restart the workers from the last checkpoint after a failure")
    overwrite: bool = opt(
        False, "delete the checkpoints and results another run left in --out, not refuse"
    )
    min_workers: int = opt(
        0,
        "live shrink: the survivors of a lost worker go on while at least this many are left "
        "(0, the default: every worker, so a loss ends the job; docs/reliability.md)",
    )
    max_workers: int = opt(
        0, "live grow: admit workers started with `train --join OUT` up to this many (0: none)"
    )
    join: str = opt("", "join the running job of this --out (it runs with --max-workers)")
    heartbeat_timeout: float = opt(
        4.0,
        "live shrink and grow: seconds without a worker's heartbeat before it is dropped "
        "(one that beats is waited for up to --timeout; docs/reliability.md)",
    )
    # multi-node pass-through (torchrun's meaning)
    nnodes: int = opt(1, "number of nodes (multi-node runs)")
    # Not sent to torch's c10d rendezvous: it reads no rank and numbers the nodes by
    # sorted host name (launch/local.py). Kept for torchrun-style command lines.
    node_rank: int = opt(
        0,
        "accepted and checked (0..nnodes-1) but not used: the c10d rendezvous numbers "
        "the nodes itself, by sorted host name",
    )
    rdzv_endpoint: str = opt("", "HOST:PORT of the rendezvous for multi-node runs")
    rdzv_id: str = opt("disttrain", "job id shared by all nodes of a multi-node run")
    # engines that start the processes (docs/launching.md)
    launcher: str = opt(
        "local",
        "who starts the processes: local (torch's elastic agent), ray (Ray Train), "
        "slurm (one agent per node of the allocation, through srun)",
        ("local", "ray", "slurm"),
    )
    ray_address: str = opt("", "--launcher ray: the cluster to join (default: a local Ray)")

    def validate(self) -> None:
        """Raise :class:`UsageError` naming the first impossible value."""
        positive = (
            "workers",
            "epochs",
            "batch_size",
            "timeout",
            "threads",
            "log_every",
            "nnodes",
            "loss_scale",
            "scale_growth_interval",
            "max_skipped_steps",
            "base_batch_size",
            "lr_step_epochs",
            "heartbeat_timeout",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise UsageError(f"--{_flag(name)} must be positive, got {getattr(self, name)}")
        if not 0.0 < self.scale_backoff < 1.0 or self.scale_growth < 1.0:
            raise UsageError("--scale-backoff must be in (0, 1) and --scale-growth >= 1")
        if self.warmup_epochs < 0 or self.prefetch < 0 or self.loader_delay_ms < 0:
            raise UsageError("--warmup-epochs, --prefetch and --loader-delay-ms must be >= 0")
        if not 0.0 <= self.lr_gamma < 1.0:
            raise UsageError(f"--lr-gamma must be in (0, 1), got {self.lr_gamma}")
        if self.checkpoint_every < 0 or self.max_restarts < 0:
            raise UsageError("--checkpoint-every and --max-restarts must be >= 0")
        if self.max_restarts and not self.checkpoint_every:
            raise UsageError("--max-restarts needs --checkpoint-every N to restart from")
        if self.async_checkpoint and not self.checkpoint_every:
            raise UsageError("--async-checkpoint needs --checkpoint-every N")
        if not 0 <= self.min_workers <= self.world_size:
            raise UsageError(
                f"--min-workers must be between 1 and the {self.world_size} workers, "
                f"got {self.min_workers}"
            )
        if self.max_workers and not self.live_grow:  # == W: joiners replace lost workers
            raise UsageError(
                f"--max-workers must exceed the {self.world_size} workers (or equal "
                f"them with --min-workers), got {self.max_workers}"
            )
        if self.max_steps < 0:
            raise UsageError(f"--max-steps must be >= 0, got {self.max_steps}")
        if self.lr <= 0:
            raise UsageError(f"--lr must be positive, got {self.lr}")
        # Whether --batch-size splits into the data shards depends on the strategy
        # (tensor and pipeline stages all see the whole batch): StrategySettings.validate_config.
        if not 0 <= self.node_rank < self.nnodes:
            raise UsageError(f"--node-rank {self.node_rank} is outside 0..{self.nnodes - 1}")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise UsageError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT")
        if self.ray_address and self.launcher != "ray":
            raise UsageError("--ray-address needs --launcher ray")
        folder = os.path.dirname(os.path.abspath(self.timeline))
        if self.timeline and not os.path.isdir(folder):
            raise UsageError(f"--timeline {self.timeline}: folder {folder} does not exist")

    def not_read(self) -> dict[str, str]:
        """The run's settings that another of its settings switches off, each with why (the
        section is always read, its conditional parts are not): fp16's loss scaler, the
        momentum factor, the decay schedules' factors, linear scaling's base batch, the
        rendezvous id of a multi-node job, and live shrink's and grow's heartbeat timeout."""
        needs = {
            ("precision", "fp16"): (
                "loss_scale", "scale_growth", "scale_backoff", "scale_growth_interval",
                "max_skipped_steps",
            ),
            ("optimizer", "momentum"): ("momentum",),
            ("lr_schedule", "step"): ("lr_step_epochs",),
            ("lr_scaling", "linear"): ("base_batch_size",),
        }  # fmt: skip
        off = {
            name: f"--{_flag(name)} is read only with --{_flag(key)} {value} "
            f"(this run: --{_flag(key)} {getattr(self, key)})"
            for (key, value), names in needs.items()
            if getattr(self, key) != value
            for name in names
        }
        if self.lr_schedule not in ("exponential", "step"):  # gamma: either decay's factor
            off["lr_gamma"] = (
                "--lr-gamma is read only with --lr-schedule exponential or step "
                f"(this run: --lr-schedule {self.lr_schedule})"
            )
        if self.nnodes == 1 and not self.rdzv_endpoint:  # one host: files, a fresh run id
            off["rdzv_id"] = "--rdzv-id is read only by a multi-node job (--nnodes > 1)"
        if not (self.live_shrink or self.live_grow):  # only a changing membership beats
            off["heartbeat_timeout"] = (
                "--heartbeat-timeout is read only with live shrink or grow "
                "(--min-workers below --workers, or --max-workers)"
            )
        return off

    @property
    def world_size(self) -> int:
        return self.workers * self.nnodes

    @property
    def live_shrink(self) -> bool:
        """True if the job goes on after losing workers (``--min-workers`` below the count)."""
        return 0 < self.min_workers < self.world_size

    @property
    def live_grow(self) -> bool:
        """True if the job admits workers that ``--join`` it (``--max-workers``)."""
        return self.max_workers > self.world_size or (
            self.max_workers == self.world_size and self.live_shrink
        )


@dataclass(frozen=True)
class DataConfig:
    """The data set and its shape: passed whole to ``load_dataset`` (read by every run)."""

    ALWAYS_READ: ClassVar[bool] = True
    TITLE: ClassVar[str] = "data"

    dataset: str = opt(
        "digits",
        "digits, synthetic, pycode, a path to an .npz file, or module:function returning a "
        "torch Dataset or a (train, test) pair of them",
    )
    loss: str = opt(
        "",
        "module:function, loss_fn(output, target) -> scalar (default: cross-entropy; a dict "
        "batch: the model's own output.loss)",
    )
    loader_workers: int = opt(
        0, "torch DataLoader worker processes per rank for --dataset module:function"
    )
    metric: str = opt(
        "",
        "module:function, metric(output, target) -> float per test batch (default: accuracy "
        "where targets are class indices)",
    )
    synthetic_size: int = opt(2048, "synthetic data set: number of samples")
    synthetic_dim: int = opt(64, "synthetic data set: input features")
    synthetic_classes: int = opt(10, "synthetic data set: classes")
    seq_len: int = opt(64, "pycode / gpt: characters of context")
    pycode_chars: int = opt(400_000, "pycode: characters of the standard library to use")

    def not_read(self) -> dict[str, str]:
        """The settings of another data set than this run's, each with why: always-read as
        the section is, ``--synthetic-*``, ``--pycode-chars`` and ``--seq-len`` shape one
        data set each."""
        own = {"synthetic": ("synthetic_size", "synthetic_dim", "synthetic_classes"),
               "pycode": ("pycode_chars", "seq_len")}  # fmt: skip
        unread = {
            name: f"--{_flag(name)} is read only with --dataset {kind} "
            f"(this run: --dataset {self.dataset})"
            for kind, names in own.items()
            if self.dataset != kind
            for name in names
        }
        if ":" not in self.dataset:  # torch's DataLoader reads a user's data set only
            unread["loader_workers"] = (
                f"--loader-workers is read only with --dataset module:function (this run: "
                f"--dataset {self.dataset})"
            )
        return unread

    def validate(self) -> None:
        for name in ("synthetic_size", "synthetic_dim", "synthetic_classes", "seq_len"):
            if getattr(self, name) <= 0:
                raise UsageError(f"--{_flag(name)} must be positive, got {getattr(self, name)}")
        if self.loader_workers < 0:
            raise UsageError(f"--loader-workers must be 0 or more, got {self.loader_workers}")


#: Section dataclasses of strategies and components; their fields join the flags.
SECTIONS: list[type[Any]] = [TrainConfig, DataConfig]


def register_section(cls: type[Any]) -> type[Any]:
    """Class decorator for a component's settings: its fields become flags and TOML keys.

    The class is a frozen dataclass built with :func:`opt` fields and a
    ``validate()`` method; field names must not clash with other sections. Its
    settings are read only by the components that declare the section (set
    ``ALWAYS_READ = True`` on a section every run reads).
    """
    if cls not in SECTIONS:
        clash = {f.name for f in dataclasses.fields(cls)} & set(section_fields())
        if clash:
            raise ValueError(f"{cls.__name__} redefines settings {sorted(clash)}")
        SECTIONS.append(cls)
    return cls


@dataclass(frozen=True)
class RunConfig:
    """All sections of one run, by class: ``cfg.train`` and ``cfg.section(PSConfig)``.

    ``given``: the settings the user gave (flags, TOML keys), whatever their value: a
    setting no chosen component reads is refused when given, even at its default."""

    sections: dict[type[Any], Any]
    given: frozenset[str] = frozenset()

    @property
    def train(self) -> TrainConfig:
        return self.sections[TrainConfig]  # type: ignore[no-any-return,unused-ignore]

    @property
    def data(self) -> DataConfig:
        return self.sections[DataConfig]  # type: ignore[no-any-return,unused-ignore]

    def get(self, name: str) -> Any:
        """The value of setting ``name``, whichever section owns it."""
        return getattr(self.sections[section_fields()[name][0]], name)

    def section(self, cls: type[Any]) -> Any:
        return self.sections[cls]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for value in self.sections.values():
            out.update(dataclasses.asdict(value))
        return out


def flag(name: str) -> str:
    """The command-line flag of setting ``name``: ``fusion_mb`` -> ``--fusion-mb``."""
    return "--" + name.replace("_", "-")


def _flag(name: str) -> str:
    return name.replace("_", "-")


def section_fields() -> dict[str, tuple[type[Any], dataclasses.Field[Any]]]:
    """Every settable name, mapped to its section and field."""
    out: dict[str, tuple[type[Any], dataclasses.Field[Any]]] = {}
    for cls in SECTIONS:
        for f in dataclasses.fields(cls):
            out[f.name] = (cls, f)
    return out


def always_read(name: str) -> bool:
    """True if every run reads setting ``name`` (its section is always read, it is not exempt)."""
    cls, f = section_fields()[name]
    return bool(getattr(cls, "ALWAYS_READ", False)) and f.metadata.get("always_read", True)


def field_names(owned: tuple[type[Any] | str, ...]) -> set[str]:
    """Setting names of a declaration: section classes stand for all their fields."""
    out: set[str] = set()
    for item in owned:
        out |= {item} if isinstance(item, str) else {f.name for f in dataclasses.fields(item)}
    return out


def changed_settings(cfg: RunConfig) -> dict[str, Any]:
    """The settings of ``cfg`` that were given (``cfg.given``) or differ from the field's
    default (a component's own default), in flag order."""
    out: dict[str, Any] = {}
    for name, (cls, f) in section_fields().items():
        section = cfg.sections.get(cls)
        if section is not None and (name in cfg.given or getattr(section, name) != f.default):
            out[name] = getattr(section, name)
    return out


def _coerce(name: str, f: dataclasses.Field[Any], value: Any) -> Any:
    kind = type(f.default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
        raise UsageError(
            f"setting {name!r} must be {kind.__name__}, got {type(value).__name__} {value!r}"
        )
    if kind is float and not math.isfinite(value):
        raise UsageError(f"--{_flag(name)} must be a finite number, got {value}")
    choices = f.metadata.get("choices")
    if choices and value not in choices:
        raise UsageError(f"--{_flag(name)} must be one of {', '.join(choices)}, got {value!r}")
    return value


def read_toml(path: str) -> dict[str, Any]:
    """Read a TOML config file into flat settings; unknown keys are errors."""
    if not os.path.isfile(path):
        raise UsageError(f"config file not found: {path}")
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"config file {path} is not valid TOML: {exc}") from None
    known = section_fields()
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in known or name == "config":
            raise UsageError(f"unknown key {key!r} in config file {path}")
        out[name] = value
    return out


def cache_dir() -> str:
    """Where disttrain keeps files it can rebuild (calibrations, data splits): the user's
    cache folder, ``$XDG_CACHE_HOME/disttrain`` (default ``~/.cache/disttrain``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "disttrain")


def choice_defaults(settings: dict[str, Any], known: dict[str, Any]) -> dict[str, Any]:
    """Defaults the run's chosen components give settings not in ``settings``.

    A component chosen by name from a registry (``--strategy diloco``, ``--compression
    topk:0.01``) may carry ``setting_defaults`` (``{"optimizer": "adam"}``): its own
    defaults for settings it reads, used unless the flag or TOML key is given. An ``lr``
    default is meant for the component's default optimizer: when another ``optimizer``
    is given, it is not used either. The chosen optimizer brings its own lr
    (:data:`OPTIMIZER_LR`), used when no flag and no other component gives one. Where
    two chosen components default one setting, the first in settings order wins (the
    strategy's, before a compressor's, before the optimizer's): no strategy with
    defaults of its own reads a compressor today, and pre-flight refuses a compressor
    the strategy does not read.
    """
    out: dict[str, Any] = {}
    for name, (_, f) in known.items():
        registry = by_flag(flag(name))
        chosen = settings.get(name, f.default)
        if registry is None or not isinstance(chosen, str):
            continue
        entry_name = chosen.strip().partition(":")[0]
        if entry_name not in registry:
            continue  # validation names the unknown choice
        entry = registry.get(entry_name)
        # a strategy's and a compressor's (``defaults_for``); other registries have none
        defaults_for = getattr(entry, "defaults_for", None)
        defaults = defaults_for(settings) if defaults_for is not None else {}
        for setting, value in defaults.items():
            if setting in settings or (
                setting == "lr"
                and "optimizer" in defaults
                and settings.get("optimizer", defaults["optimizer"]) != defaults["optimizer"]
            ):
                continue
            out.setdefault(setting, value)
    if "lr" not in settings:  # last: a strategy's or compressor's lr was tuned with its optimizer
        optimizer = settings.get("optimizer", out.get("optimizer", known["optimizer"][1].default))
        out.setdefault("lr", OPTIMIZER_LR.get(optimizer, known["lr"][1].default))
    return out


def load(flags: dict[str, Any], config_file: str | None = None) -> RunConfig:
    """Build and validate a run's config from given flags over an optional TOML file."""
    settings = read_toml(config_file) if config_file else {}
    settings.update(flags)
    given = frozenset(settings)
    known = section_fields()
    settings.update(choice_defaults(settings, known))
    per_section: dict[type[Any], dict[str, Any]] = {cls: {} for cls in SECTIONS}
    for name, value in settings.items():
        cls, f = known[name]
        per_section[cls][name] = _coerce(name, f, value)
    sections = {cls: cls(**values) for cls, values in per_section.items()}
    for section in sections.values():
        section.validate()
    return RunConfig(sections, given)
