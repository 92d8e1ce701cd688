"""Compressors by spec: ``none``, ``fp16``, ``bf16``, ``topk:RATIO``, ``onebit:TAU``.

:data:`COMPRESSORS` holds one :class:`CompressorKind` per name: how to build it
from the spec's parameter, the parameter a bare name gets in a ``compare`` /
``advise`` spec (``decentralized:onebit``), and what the cost model needs to size
its payload. A plug-in compressor registers its kind the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from disttrain.comm.errors import UsageError
from disttrain.compression.base import Compressor
from disttrain.compression.casts import BF16, FP16, Identity
from disttrain.compression.onebit import OneBit
from disttrain.compression.topk import TopK
from disttrain.registry import Registry

__all__ = ["COMPRESSORS", "SPECS", "CompressorKind", "parse", "specs", "with_default"]


@dataclass(frozen=True)
class CompressorKind:
    """One compressor name: its builder, parameter, spec default and payload size facts."""

    build: Callable[..., Compressor]  # called with the parameter, or with none
    param: str = ""  # "RATIO": the spec's parameter (``topk:RATIO``); "" takes none
    param_help: str = ""  # how to write the parameter, for the error message
    default: str = ""  # a bare name's parameter in a compare/advise spec ("" none)
    # Cost model: bits per sent value, and the share of entries sent: "all" (dense, no
    # index), "param" (the parameter is the share) or "data" (depends on the gradients).
    value_bits: int = 32
    density: str = "all"


#: Every compressor by name (``--compression NAME[:PARAM]``).
COMPRESSORS: Registry[CompressorKind] = Registry("compressor", flag="--compression")
COMPRESSORS.add("none", CompressorKind(Identity))
COMPRESSORS.add("fp16", CompressorKind(FP16, value_bits=16))
COMPRESSORS.add("bf16", CompressorKind(BF16, value_bits=16))
COMPRESSORS.add("topk", CompressorKind(TopK, "RATIO", "RATIO in (0, 1]", "0.001", density="param"))
# 0.03 is the τ that kept accuracy with 4,135x fewer bytes on digits/mlp
# (benchmarks/RESULTS.md, "Talking less").
COMPRESSORS.add(
    "onebit",
    CompressorKind(OneBit, "TAU", "threshold TAU > 0", "0.03", value_bits=1, density="data"),
)


def specs() -> tuple[str, ...]:
    """The spec forms ``parse`` accepts (``topk:RATIO``), in registration order."""
    return tuple(f"{n}:{k.param}" if k.param else n for n, k in COMPRESSORS.items())


#: The spec forms of the built-in compressors, for help texts.
SPECS = specs()


def with_default(spec: str) -> str:
    """A bare name that takes a parameter gets its default (``onebit`` -> ``onebit:0.03``)."""
    name = spec.strip()
    if name in COMPRESSORS and COMPRESSORS.get(name).default:
        return f"{name}:{COMPRESSORS.get(name).default}"
    return spec


def parse(spec: str) -> Compressor:
    """Build the compressor a spec names; a bad spec raises :class:`UsageError`."""
    name, sep, arg = spec.strip().partition(":")
    if name not in COMPRESSORS:
        # the forms, not only the names: the parameter is part of what to write
        raise UsageError(f"--compression {spec!r}: choose one of {', '.join(specs())}")
    kind = COMPRESSORS.get(name)
    if not kind.param:
        if sep:
            raise UsageError(f"--compression {spec!r}: {name} takes no argument")
        return kind.build()
    try:
        value = float(arg)
    except ValueError:
        raise UsageError(f"--compression {spec!r}: write {name}:{kind.param_help}") from None
    try:
        return kind.build(value)
    except ValueError as exc:
        raise UsageError(f"--compression {spec!r}: {exc}") from None
