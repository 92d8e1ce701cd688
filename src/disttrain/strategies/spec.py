"""One run spec grammar for ``disttrain compare`` and ``disttrain advise``:
``strategy[:value][:key=value...]``.

A list is comma-separated; each item names a registered strategy, then
optionally its main setting (its settings part's ``main_setting``), then any
``disttrain train`` setting as ``key=value`` (dashes or underscores)::

    allreduce:ring                 --strategy allreduce --algorithm ring
    ps:async                       --strategy ps --ps-mode async
    localsgd:period=16             --strategy localsgd --period 16
    localsgd:16                    the same (the main setting of localsgd is --period)
    decentralized:onebit           --strategy decentralized --compression onebit:0.03
    decentralized:onebit:0.05      --compression onebit:0.05
    decentralized:topk:optimizer=sgd:lr=0.5

Colons split the parts; a part without ``=`` continues the value before it
(``onebit:0.05`` is one value, so is ``compression=onebit:0.05``). A bare
compressor name gets the default parameter its compression registry entry
states. Values are typed by the flag they set (``true``/``false`` for switches).

``advise`` parses with ``model=True``: then only the settings the strategy's cost
formula reads (``cost_settings``) are accepted, plus its cost-model assumptions
(``decentralized:onebit:density=0.01``: what one-bit sends is not known from τ).
"""

from __future__ import annotations

from typing import Any

from disttrain.comm.errors import UsageError
from disttrain.strategies.runspec import RunSpec

__all__ = ["RunSpec", "parse_one", "parse_specs"]

_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")
# compare sets these itself, once for every run
_RESERVED = ("strategy", "out", "progress", "nnodes", "node_rank", "rdzv_endpoint", "rdzv_id")


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


def _parts(label: str, parts: list[str]) -> list[list[str]]:
    """[key or "", value] pairs: a part without '=' continues the previous value."""
    raw: list[list[str]] = []
    for part in parts:
        if "=" in part:
            key, value = part.split("=", 1)
            if not key.strip():
                raise UsageError(f"--strategies {label!r}: {part!r} has no name before '='")
            raw.append([key, value])
        elif raw:
            raw[-1][1] += ":" + part
        else:
            raw.append(["", part])
    return raw


def _assumption(text: str, name: str, label: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"--strategies {label!r}: {name}={text!r} is not a number") from None


def parse_one(text: str, model: bool = False) -> RunSpec:
    """One ``strategy[:value][:key=value...]``; raises UsageError naming what is wrong.

    ``model``: for the cost model (``advise``): the strategy's assumptions are accepted,
    settings its formula does not read are refused.
    """
    from disttrain.compression.registry import with_default
    from disttrain.strategies.base import STRATEGIES

    label = text.strip()
    parts = label.split(":")
    kind = STRATEGIES.get(parts[0].strip())  # an unknown name: the registry's usage error
    main, cost = kind.settings.main_setting, kind.cost_model()  # the lab's: cost imported
    settings: dict[str, Any] = {}
    assumptions: dict[str, float] = {}
    for key, value in _parts(label, parts[1:]):
        if not key:
            if main is None:
                raise UsageError(
                    f"--strategies {label!r}: {kind.name} has no main setting; "
                    "write key=value (e.g. workers=4)"
                )
            name = main
        elif key.strip() in cost.assumptions:
            name = key.strip()
            if not model:
                raise UsageError(
                    f"--strategies {label!r}: {name}= is an assumption of the cost model; "
                    "only `disttrain advise` reads it"
                )
        else:
            name = _setting_name(key, label)
        flag = name.replace("_", "-")
        if not value.strip():
            raise UsageError(f"--strategies {label!r}: empty value for {flag}")
        if name in settings or name in assumptions:
            raise UsageError(f"--strategies {label!r}: {flag} given twice")
        if model and name not in cost.cost_settings and name not in cost.assumptions:
            raise UsageError(
                f"--strategies {label!r}: the cost model of {kind.name} does not read {flag}"
                + (f" (it reads {', '.join(cost.cost_settings)})" if cost.cost_settings else "")
            )
        value = value.strip()
        if name in cost.assumptions:
            assumptions[name] = _assumption(value, name, label)
            continue
        if name == "compression":
            value = with_default(value)
        settings[name] = _typed(name, value, label)
    return RunSpec(label, kind.name, settings, assumptions)


def parse_specs(text: str, model: bool = False) -> list[RunSpec]:
    """The comma-separated list; at least one, labels unique."""
    items = [t for t in (s.strip() for s in text.split(",")) if t]
    if not items:
        raise UsageError("--strategies: give at least one, e.g. 'allreduce:ring, ps:async'")
    specs = []
    for item in items:
        try:
            specs.append(parse_one(item, model))
        except UsageError as exc:  # the registry names --strategy; the user typed --strategies
            raise UsageError(f"--strategies: {str(exc).removeprefix('--strategy ')}") from None
    seen: set[str] = set()
    for spec in specs:
        if spec.label in seen:
            raise UsageError(f"--strategies: {spec.label!r} is listed twice")
        seen.add(spec.label)
    return specs
