"""Strom (2015) threshold quantization: entries beyond ±tau are sent as index + one sign bit.

"Scalable distributed DNN training using commodity GPU cloud computing"
(Interspeech 2015): each worker adds its gradient to a residual; every entry
whose accumulated value exceeds tau in magnitude is sent as its index and a
sign bit meaning +tau or -tau, and tau is subtracted from the residual there;
everything else waits in the residual (see :mod:`error_feedback`). Large
updates are thus sent at a higher rate, small ones later; nothing is lost.
Strom reports about three orders of magnitude less traffic without loss of
accuracy, with tau tuned per model.

Wire: the index code (:mod:`index_coding`), then ceil(n/8) bytes of sign bits
(1 = negative). Cost per sent entry: ~(gap code) + 1 bits.
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

__all__ = ["OneBit"]


class OneBit(SparseCompressor):
    """Send ``sign(x) * tau`` where ``|x| > tau``, as coded indices and sign bits."""

    name = "onebit"

    def __init__(self, tau: float) -> None:
        if not tau > 0 or not math.isfinite(tau):
            raise ValueError(f"onebit threshold tau must be a positive number, got {tau}")
        self.tau = float(tau)

    @property
    def spec(self) -> str:
        return f"onebit:{self.tau:g}"

    @property
    def nominal_share(self) -> float:
        # the data sets it (how many accumulated entries pass tau): what its recommended tau
        # sent in the default run's first 20 steps stands for its budget: 88.6 of 6,437,898
        # entries a step, 1.4e-5 (summary.json's entries_sent_per_step of `disttrain train
        # --strategy decentralized --compression onebit:0.03 --max-steps 20`). 0.5 sent none.
        return 1e-5

    def compress(self, tensor: torch.Tensor) -> Payload:
        return self.compress_and_decode(tensor)[0]

    def compress_and_decode(self, tensor: torch.Tensor) -> tuple[Payload, torch.Tensor]:
        flat = tensor.detach().reshape(-1)
        idx = torch.nonzero(flat.abs() > self.tau).reshape(-1)
        negative = flat[idx] < 0
        code = encode_indices(idx.numpy())
        signs = np.packbits(negative.numpy().astype(np.uint8))
        sent = torch.zeros(flat.numel(), dtype=torch.float32)
        sent[idx] = torch.where(negative, -self.tau, self.tau)
        return Payload(torch.from_numpy(np.concatenate([code, signs])), flat.numel()), sent

    def _split(self, payload: Payload) -> tuple[np.ndarray, np.ndarray, int]:
        buf = payload.data.numpy()
        idx, used = decode_indices(buf)
        signs = np.unpackbits(buf[used : used + math.ceil(idx.size / 8)])[: idx.size]
        return idx, signs, used

    def entries(self, payload: Payload) -> tuple[np.ndarray, np.ndarray]:
        idx, signs, _ = self._split(payload)
        return idx, np.where(signs == 1, -self.tau, self.tau).astype(np.float32)

    def wire_bytes(self, payload: Payload) -> int:
        idx, _, _ = self._split(payload)
        gaps = np.diff(idx, prepend=-1) - 1
        k = int(payload.data[4]) if payload.data.numel() > 4 else 0
        # header + exp-Golomb bits of the gaps + one sign bit per entry
        return coded_bytes(idx.size, k, gaps) + math.ceil(idx.size / 8)


# A bare `onebit` in a compare spec means tau 0.03: the threshold that kept accuracy on
# digits/mlp with about 4,000x fewer bytes (benchmarks/RESULTS.md, "Talking less").
COMPRESSORS.add(
    "onebit",
    CompressorKind(
        OneBit,
        "TAU",
        "threshold TAU > 0",
        "0.03",
        value_bits=1,
        density="data",
        setting_defaults=SPARSE_DEFAULTS,
    ),
)  # fmt: skip
