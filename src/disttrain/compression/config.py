"""The ``--compression`` settings shared by the strategies that send compressed updates."""

from __future__ import annotations

from dataclasses import dataclass

from disttrain.compression.registry import SPECS, parse
from disttrain.config import opt, register_section

__all__ = ["CompressionConfig"]


@register_section
@dataclass(frozen=True)
class CompressionConfig:
    """Which compressor updates go through, and whether its residual is kept."""

    compression: str = opt(
        "none",
        f"compressor for decentralized (and compressed allreduce): {', '.join(SPECS)}; "
        "topk and onebit default to --optimizer sgd --lr 0.5 (docs/compression.md)",
    )
    error_feedback: bool = opt(True, "keep what compression leaves out and send it later")

    def validate(self) -> None:
        parse(self.compression)
