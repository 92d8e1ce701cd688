"""Compressors by spec: ``none``, ``fp16``, ``bf16``, ``topk:RATIO``, ``onebit:TAU``.

:data:`COMPRESSORS` holds one :class:`CompressorKind` per name: how to build it
from the spec's parameter, the parameter a bare name gets in a ``compare`` /
``advise`` spec (``decentralized:onebit``), and what the cost model needs to size
its payload. A plug-in compressor registers its kind the same way.
"""

from __future__ import annotations

from disttrain.comm.errors import UsageError
from disttrain.compression.base import COMPRESSORS, Compressor, CompressorKind
from disttrain.registry import import_submodules

#: Modules of this package that hold no compressor (the rest register one each).
HELPERS = (
    "base",
    "blockquant",
    "config",
    "error_feedback",
    "exchange",
    "index_coding",
    "registry",
)

import_submodules("disttrain.compression", skip=HELPERS)

__all__ = [
    "COMPRESSORS",
    "HELPERS",
    "SPECS",
    "CompressorKind",
    "parse",
    "section_of",
    "sections",
    "specs",
    "with_default",
]


def specs() -> tuple[str, ...]:
    """The spec forms ``parse`` accepts (``topk:RATIO``), in registration order."""
    return tuple(f"{n}:{k.param}" if k.param else n for n, k in COMPRESSORS.items())


def sections() -> tuple[type, ...]:
    """The compressors' own settings sections (``CompressorKind.section``), in order."""
    return tuple(k.section for _, k in COMPRESSORS.items() if k.section is not None)


def section_of(spec: str) -> type | None:
    """The settings section the compressor of ``spec`` reads (None: none)."""
    return COMPRESSORS.get(spec.strip().partition(":")[0]).section


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
