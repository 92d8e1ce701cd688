"""Horovod's gradient compression: a cast before the wire and back after it.

``Compression.none``, ``Compression.fp16`` (Horovod's) and ``Compression.bf16`` (ours:
bfloat16 keeps fp32's range, so large gradients do not overflow). Integer tensors pass
through unchanged, as in Horovod.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["BF16Compressor", "Compression", "Compressor", "FP16Compressor", "NoneCompressor"]


class Compressor:
    """``compress(t) -> (t', ctx)`` before the collective, ``decompress(t', ctx)`` after."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression: the tensor itself, no context."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class _CastCompressor(Compressor):
    """A floating tensor travels as :attr:`wire`; the context is its own dtype."""

    wire: torch.dtype = torch.float16

    @classmethod
    def compress(cls, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if tensor.dtype.is_floating_point:
            return tensor.to(cls.wire), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        if isinstance(ctx, torch.dtype) and ctx.is_floating_point and tensor.dtype != ctx:
            return tensor.to(ctx)
        return tensor


class FP16Compressor(_CastCompressor):
    """Floating tensors travel as float16 (the sum is taken in float16, as in Horovod)."""

    wire = torch.float16


class BF16Compressor(_CastCompressor):
    """Floating tensors travel as bfloat16 (fp32's range, 8 bits of mantissa)."""

    wire = torch.bfloat16


class Compression:
    """The compressors by Horovod's names: ``Compression.none``, ``.fp16``, ``.bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
