"""Dense casts to 16-bit floats (fp16, bf16) and the identity (fp32): summable by any allreduce.

Half the bytes of fp32 at a rounding error of 2^-11 (fp16) or 2^-8 (bf16)
relative per entry. fp16 overflows beyond 65504 (sums of many large gradients
can reach it); bf16 keeps fp32's range at lower precision.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from disttrain.compression.base import COMPRESSORS, Compressor, CompressorKind, Payload

__all__ = ["BF16", "FP16", "Identity", "cast_dtype"]


class _Cast(Compressor):
    summable = True
    wire_dtype: ClassVar[torch.dtype] = torch.float32
    bytes_per_entry: ClassVar[int] = 4

    # copy=True: for ``none`` a plain .to() would alias the input, and error
    # feedback subtracts what was sent from that very tensor.
    def compress(self, tensor: torch.Tensor) -> Payload:
        flat = tensor.detach().reshape(-1)
        return Payload(flat.to(self.wire_dtype, copy=True), tensor.numel())

    def decompress(self, payload: Payload) -> torch.Tensor:
        return payload.data.to(torch.float32, copy=True)

    def wire_bytes(self, payload: Payload) -> int:
        return self.bytes_per_entry * payload.numel

    def fixed_wire_numel(self, numel: int) -> int | None:
        return numel


class Identity(_Cast):
    """No compression: the fp32 tensor itself (the dense baseline)."""

    name = "none"
    wire_dtype = torch.float32
    bytes_per_entry = 4


class FP16(_Cast):
    """IEEE half precision: 2 bytes per entry."""

    name = "fp16"
    wire_dtype = torch.float16
    bytes_per_entry = 2


class BF16(_Cast):
    """bfloat16 (fp32's exponent, 8-bit mantissa): 2 bytes per entry."""

    name = "bf16"
    wire_dtype = torch.bfloat16
    bytes_per_entry = 2


def cast_dtype(compressor: Compressor) -> torch.dtype | None:
    """The type a cast compressor sends (float32 for ``none``); None for any other compressor.

    Casts need no exchange of their own: the data-parallel reducer sends its fused
    buckets in this type (``--compression fp16`` on the allreduce strategy).
    """
    return compressor.wire_dtype if isinstance(compressor, _Cast) else None


COMPRESSORS.add("none", CompressorKind(Identity))
COMPRESSORS.add("fp16", CompressorKind(FP16, value_bits=16))
COMPRESSORS.add("bf16", CompressorKind(BF16, value_bits=16))
