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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from disttrain.comm.errors import UsageError
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


@dataclass(frozen=True)
class _OneBitKind(CompressorKind):
    """One-bit trains with its own optimizer default, with DGC's momentum correction, or
    with an lr chosen for the optimizer given; not with another optimizer's own lr.

    Measured on the default workload after 3 epochs (benchmarks/RESULTS.md, "Defaults that
    train", each optimizer): sgd at lr 0.5 (its default) 0.928; momentum at its lr 0.05
    0.628, adam at 0.001 0.594. top-k trains with each (0.889-0.922): the rule is one-bit's.
    ``--momentum-correction`` (the decentralized strategy's; SPARSE_DEFAULTS: 0.914 after 5
    epochs) replaces the optimizer's momentum, so it brings ``--optimizer momentum``."""

    def defaults_for(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        if settings.get("momentum_correction"):
            return {"optimizer": "momentum"}  # the strategy refuses another optimizer
        mine = self.setting_defaults["optimizer"]
        chosen = settings.get("optimizer", mine)
        if chosen != mine and "lr" not in settings:
            also = ", add --momentum-correction" if chosen == "momentum" else ""
            raise UsageError(
                f"--compression {settings.get('compression', 'onebit')} with --optimizer "
                f"{chosen} at its default lr does not train (0.63 or less after 3 epochs of "
                f"the default run): use `--optimizer {mine}` (onebit's default, lr "
                f"{self.setting_defaults['lr']:g}){also}, or give --lr"
            )
        return dict(self.setting_defaults)


# A bare `onebit` in a compare spec means tau 0.03: the threshold that kept accuracy on
# digits/mlp with about 4,000x fewer bytes (benchmarks/RESULTS.md, "Talking less").
COMPRESSORS.add(
    "onebit",
    _OneBitKind(
        OneBit,
        "TAU",
        "threshold TAU > 0",
        "0.03",
        value_bits=1,
        density="data",
        setting_defaults=SPARSE_DEFAULTS,
    ),
)
