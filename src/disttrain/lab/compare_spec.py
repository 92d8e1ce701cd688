"""The ``--strategies`` grammar of ``disttrain compare``: ``strategy[:value][:key=value...]``.

A list is comma-separated; each item names a registered strategy, then
optionally its main setting, then any ``disttrain train`` setting as
``key=value`` (dashes or underscores)::

    allreduce:ring                 --strategy allreduce --algorithm ring
    ps:async                       --strategy ps --ps-mode async
    localsgd:period=16             --strategy localsgd --period 16
    localsgd:16                    the same (the main setting of localsgd is --period)
    decentralized:onebit           --strategy decentralized --compression onebit:0.03
    decentralized:onebit:0.05      --compression onebit:0.05
    decentralized:topk:optimizer=sgd:lr=0.5

Colons split the parts; a part without ``=`` continues the value before it
(``onebit:0.05`` is one value, so is ``compression=onebit:0.05``). A bare
compressor name gets the default parameter of :data:`DEFAULT_COMPRESSION`.
Values are typed by the flag they set (``true``/``false`` for switches).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from disttrain.comm.errors import UsageError

__all__ = ["DEFAULT_COMPRESSION", "MAIN_SETTING", "RunSpec", "parse_specs"]

#: The setting a strategy's positional value sets (``allreduce:ring`` -> algorithm=ring).
MAIN_SETTING: dict[str, str] = {
    "allreduce": "algorithm",
    "ps": "ps_mode",
    "localsgd": "period",
    "decentralized": "compression",
    "pipeline": "schedule",
    "tensor": "tensor_mode",
}

#: A bare compressor name's parameter. onebit 0.03 is the τ that kept accuracy
#: with 4,135x fewer bytes on digits/mlp (benchmarks/RESULTS.md, "Talking less").
DEFAULT_COMPRESSION: dict[str, str] = {"onebit": "onebit:0.03", "topk": "topk:0.001"}

_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")
# compare sets these itself, once for every run
_RESERVED = ("strategy", "out", "progress", "nnodes", "node_rank", "rdzv_endpoint", "rdzv_id")


@dataclass(frozen=True)
class RunSpec:
    """One run of a comparison: its label (the spec as written) and its train settings."""

    label: str
    strategy: str
    settings: dict[str, Any] = field(default_factory=dict)

    def flags(self, common: dict[str, Any]) -> dict[str, Any]:
        """The ``disttrain train`` flags of this run: ``common`` overridden by the spec."""
        return {**common, "strategy": self.strategy, **self.settings}


def _typed(name: str, text: str, label: str) -> Any:
    """``text`` as the type of setting ``name``'s default (UsageError if it cannot be)."""
    from disttrain.config import section_fields

    _, f = section_fields()[name]
    kind: Any = type(f.default)
    try:
        if kind is bool:
            if text.lower() not in _TRUE + _FALSE:
                raise ValueError
            return text.lower() in _TRUE
        return kind(text)
    except ValueError:
        raise UsageError(
            f"--strategies {label!r}: {name.replace('_', '-')}={text!r} is not a {kind.__name__}"
        ) from None


def _setting_name(key: str, label: str) -> str:
    from disttrain.config import section_fields

    name = key.strip().lstrip("-").replace("-", "_")
    if name not in section_fields():
        raise UsageError(
            f"--strategies {label!r}: {key!r} is not a train setting (see `disttrain train --help`)"
        )
    if name in _RESERVED:
        raise UsageError(f"--strategies {label!r}: compare sets --{name.replace('_', '-')} itself")
    return name


def parse_one(text: str) -> RunSpec:
    """One ``strategy[:value][:key=value...]``; raises UsageError naming what is wrong."""
    import disttrain.strategies  # noqa: F401  (register every strategy and its settings)
    from disttrain.strategies import STRATEGIES

    label = text.strip()
    parts = label.split(":")
    strategy = parts[0].strip()
    if strategy not in STRATEGIES:
        raise UsageError(
            f"--strategies {label!r}: unknown strategy {strategy!r}; "
            f"choose from {', '.join(sorted(STRATEGIES))}"
        )
    # group the parts: a part without '=' continues the previous value
    raw: list[list[str]] = []  # [key or "", value]
    for part in parts[1:]:
        if "=" in part:
            key, value = part.split("=", 1)
            if not key.strip():
                raise UsageError(f"--strategies {label!r}: {part!r} has no name before '='")
            raw.append([key, value])
        elif raw:
            raw[-1][1] += ":" + part
        else:
            raw.append(["", part])
    settings: dict[str, Any] = {}
    for key, value in raw:
        if not key:
            if strategy not in MAIN_SETTING:
                raise UsageError(
                    f"--strategies {label!r}: {strategy} has no main setting; "
                    "write key=value (e.g. workers=4)"
                )
            name = MAIN_SETTING[strategy]
        else:
            name = _setting_name(key, label)
        if not value.strip():
            raise UsageError(f"--strategies {label!r}: empty value for {name.replace('_', '-')}")
        if name in settings:
            raise UsageError(f"--strategies {label!r}: {name.replace('_', '-')} given twice")
        value = value.strip()
        if name == "compression":
            value = DEFAULT_COMPRESSION.get(value, value)
        settings[name] = _typed(name, value, label)
    return RunSpec(label, strategy, settings)


def parse_specs(text: str) -> list[RunSpec]:
    """The comma-separated list; at least one, labels unique."""
    items = [t for t in (s.strip() for s in text.split(",")) if t]
    if not items:
        raise UsageError("--strategies: give at least one, e.g. 'allreduce:ring, ps:async'")
    specs = [parse_one(t) for t in items]
    seen: set[str] = set()
    for spec in specs:
        if spec.label in seen:
            raise UsageError(f"--strategies: {spec.label!r} is listed twice")
        seen.add(spec.label)
    return specs
