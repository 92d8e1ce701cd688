"""Compressors by spec: ``none``, ``fp16``, ``bf16``, ``topk:RATIO``, ``onebit:TAU``."""

from __future__ import annotations

from disttrain.comm.errors import UsageError
from disttrain.compression.base import Compressor
from disttrain.compression.casts import BF16, FP16, Identity
from disttrain.compression.onebit import OneBit
from disttrain.compression.topk import TopK

__all__ = ["SPECS", "parse"]

#: The spec forms ``parse`` accepts, for help texts.
SPECS = ("none", "fp16", "bf16", "topk:RATIO", "onebit:TAU")


def parse(spec: str) -> Compressor:
    """Build the compressor a spec names; a bad spec raises :class:`UsageError`."""
    name, sep, arg = spec.strip().partition(":")
    simple = {"none": Identity, "fp16": FP16, "bf16": BF16}
    if name in simple:
        if sep:
            raise UsageError(f"--compression {spec!r}: {name} takes no argument")
        return simple[name]()
    if name in ("topk", "onebit"):
        try:
            value = float(arg)
        except ValueError:
            what = "RATIO in (0, 1]" if name == "topk" else "threshold TAU > 0"
            raise UsageError(f"--compression {spec!r}: write {name}:{what}") from None
        try:
            return TopK(value) if name == "topk" else OneBit(value)
        except ValueError as exc:
            raise UsageError(f"--compression {spec!r}: {exc}") from None
    raise UsageError(f"--compression {spec!r}: choose one of {', '.join(SPECS)}")
