"""The ``--compression`` settings shared by the strategies that send compressed updates."""

from __future__ import annotations

from dataclasses import dataclass

from disttrain.compression.registry import COMPRESSORS, SPECS, parse
from disttrain.config import flag, opt, register_section

__all__ = ["CompressionConfig"]


def _defaults_help() -> str:
    """What each compressor with defaults of its own sets (``CompressorKind.setting_defaults``)."""
    parts = []
    for name, kind in COMPRESSORS.items():
        given = " ".join(f"{flag(k)} {v}" for k, v in kind.setting_defaults.items())
        if given:
            parts.append(f"{name} defaults to {given}")
    return f"; {', '.join(parts)} (docs/compression.md)" if parts else ""


@register_section
@dataclass(frozen=True)
class CompressionConfig:
    """Which compressor updates go through, and whether its residual is kept."""

    compression: str = opt(
        "none",
        f"compressor for decentralized (and compressed allreduce): {', '.join(SPECS)}"
        + _defaults_help(),
    )
    error_feedback: bool = opt(True, "keep what compression leaves out and send it later")

    def validate(self) -> None:
        parse(self.compression)
