"""The published rows' assumptions, read from the data beside the rows.

Each ``[[row]]`` of benchmarks/published/*.toml carries its own: ``why`` (the one line of
what the model leaves out; ``why_after_run`` adds what was learned after a check's one
run), ``not_modelled`` or ``apart`` (the reason a row is not scored), ``strong = true``
(its baseline keeps the global batch), and ``[row.assume]``, the scenario inputs its
source leaves out. What several rows share is named once in benchmarks/published/
shared.toml (networks, model shapes, fitted families) and referenced by name: ``hw`` names
a ``[network.*]`` and ``model`` may name a ``[shape.*]``. benchmarks/published/README.md,
"Assumptions beside the rows".
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, NamedTuple

import tomllib

from disttrain.comm.errors import UsageError

__all__ = ["SHARED", "Shared", "apart", "assume", "not_modelled", "shared", "strong", "why"]

SHARED = Path(__file__).resolve().parents[4] / "benchmarks" / "published" / "shared.toml"


class Shared(NamedTuple):
    """shared.toml's named tables."""

    networks: dict[str, dict[str, Any]]
    shapes: dict[str, dict[str, Any]]
    #: family -> the calibration row its gpu_tflops is fitted on
    families: dict[str, str]
    #: family -> the GPU's memory bandwidth (bytes/s) of the roofline that moves its rate
    memory_bandwidth: dict[str, float]
    #: intra-node family -> the calibration row its bandwidth is fitted on
    intra_families: dict[str, str]


@functools.cache
def shared(path: Path = SHARED) -> Shared:
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    families = data.get("family", {})
    return Shared(
        networks=data.get("network", {}),
        shapes=data.get("shape", {}),
        families={name: f["row"] for name, f in families.items()},
        memory_bandwidth={name: f["memory_bandwidth"] for name, f in families.items()},
        intra_families={name: f["row"] for name, f in data.get("intra_family", {}).items()},
    )


def _named(kind: str, tables: dict[str, dict[str, Any]], name: Any, row_id: str) -> Any:
    if not isinstance(name, str):
        return name
    if name not in tables:
        raise UsageError(f"{row_id}: [row.assume] names {kind} {name!r}, not in {SHARED.name}")
    return tables[name]


def assume(row: dict[str, Any]) -> dict[str, Any]:
    """The row's ``[row.assume]`` with its names resolved; {} when it has none. Keys: ``run``
    and ``base`` (tables of the scenario's run, and of its baseline), ``model``, ``hw``, and
    the rate's (``rate``, ``rate_from``, ``rate_tflops_from``, ``family``, ``intra_family``)."""
    given = row.get("assume", {})
    if not given:
        return {}
    named = shared()
    out = dict(given)
    if "hw" in out:
        out["hw"] = _named("network", named.networks, out["hw"], row["id"])
    if "model" in out:
        out["model"] = _named("shape", named.shapes, out["model"], row["id"])
    return out


def why(row: dict[str, Any]) -> str:
    """The row's one line; a check's afterthought joined to it as it was written."""
    text = str(row.get("why", ""))
    if "why_after_run" in row:
        text = f"{text}; after the run: {row['why_after_run']}"
    return text


def not_modelled(row: dict[str, Any]) -> str | None:
    return row.get("not_modelled")


def apart(row: dict[str, Any]) -> str | None:
    return row.get("apart")


def strong(row: dict[str, Any]) -> bool:
    return bool(row.get("strong", False))
