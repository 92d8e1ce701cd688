"""Top-k sparsification: the ``ratio·n`` entries of largest magnitude, fp32 values + coded indices.

Wire: the index code (:mod:`index_coding`, self-delimiting) then the k values
as fp32. Used with error feedback (Aji & Heafield 2017; Stich et al. 2018), the
entries left out are kept in the residual and sent later.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from disttrain.compression.base import (
    COMPRESSORS,
    SPARSE_DEFAULTS,
    CompressorKind,
    Payload,
    SparseCompressor,
)
from disttrain.compression.index_coding import coded_bytes, decode_indices, encode_indices

__all__ = ["TopK"]


class TopK(SparseCompressor):
    """Keep ``ceil(ratio * numel)`` entries of largest magnitude."""

    name = "topk"

    def __init__(self, ratio: float) -> None:
        if not 0 < ratio <= 1:
            raise ValueError(f"topk ratio must be in (0, 1], got {ratio}")
        self.ratio = ratio

    @property
    def spec(self) -> str:
        return f"topk:{self.ratio:g}"

    @property
    def nominal_share(self) -> float:
        return self.ratio

    def compress(self, tensor: torch.Tensor) -> Payload:
        return self.compress_and_decode(tensor)[0]

    def compress_and_decode(self, tensor: torch.Tensor) -> tuple[Payload, torch.Tensor]:
        flat = tensor.detach().reshape(-1).float()
        k = min(flat.numel(), max(1, math.ceil(self.ratio * flat.numel())))
        idx = torch.topk(flat.abs(), k, sorted=False).indices.sort().values
        code = encode_indices(idx.numpy())
        values = flat[idx]
        data = torch.from_numpy(np.concatenate([code, values.numpy().astype("<f4").view(np.uint8)]))
        sent = torch.zeros(flat.numel(), dtype=torch.float32)
        sent[idx] = values
        return Payload(data, flat.numel()), sent

    def _split(self, payload: Payload) -> tuple[np.ndarray, np.ndarray, int]:
        buf = payload.data.numpy()
        idx, used = decode_indices(buf)
        values = buf[used : used + 4 * idx.size].copy().view("<f4")
        return idx, values, used

    def entries(self, payload: Payload) -> tuple[np.ndarray, np.ndarray]:
        idx, values, _ = self._split(payload)
        return idx, values.astype(np.float32)

    def wire_bytes(self, payload: Payload) -> int:
        idx, _, _ = self._split(payload)
        gaps = np.diff(idx, prepend=-1) - 1
        k = int(payload.data[4]) if payload.data.numel() > 4 else 0
        # header + exp-Golomb bits of the gaps + 4 bytes per fp32 value
        return coded_bytes(idx.size, k, gaps) + 4 * idx.size


COMPRESSORS.add(
    "topk",
    CompressorKind(
        TopK,
        "RATIO",
        "RATIO in (0, 1]",
        "0.001",
        density="param",
        setting_defaults=SPARSE_DEFAULTS,
    ),
)
