"""Error feedback: a per-worker residual that keeps what compression left out, sent later.

    acc = residual + x;  payload = C(acc);  residual = acc - D(payload)

so over any number of steps, sum(sent) + residual == sum(inputs): compression
delays information instead of losing it (Strom 2015; Seide et al. 2014 for
1-bit SGD; Karimireddy et al. 2019 for why it restores convergence).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

from disttrain.compression.base import Compressor, Payload

__all__ = ["ErrorFeedback"]

T = TypeVar("T")


class ErrorFeedback:
    """Wraps a compressor with a residual of the dense length; ``state_dict``-able."""

    def __init__(self, compressor: Compressor, enabled: bool = True) -> None:
        self.compressor = compressor
        self.enabled = enabled
        self.residual: torch.Tensor | None = None

    def compress(self, tensor: torch.Tensor) -> tuple[Payload, torch.Tensor]:
        """Compress ``residual + tensor``; return the payload and what it decodes to."""
        return self.apply(tensor, self.compressor.compress_and_decode)

    def apply(
        self, tensor: torch.Tensor, code: Callable[[torch.Tensor], tuple[T, torch.Tensor]]
    ) -> tuple[T, torch.Tensor]:
        """``code(residual + tensor)`` -> (anything, what counts as sent); the residual keeps
        the rest. ``compress`` with a payload; a collective compressor's ``reduce`` with a sum."""
        flat = tensor.detach().reshape(-1).float()
        if not self.enabled:
            return code(flat)
        if self.residual is None or self.residual.numel() != flat.numel():
            self.residual = torch.zeros_like(flat)
        acc = self.residual.add_(flat)  # the residual becomes acc, in place
        out, sent = code(acc)
        acc.sub_(sent)
        return out, sent

    def residual_norm(self) -> float:
        return 0.0 if self.residual is None else float(self.residual.norm())

    def state_dict(self) -> dict[str, Any]:
        return {"residual": None if self.residual is None else self.residual.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        res = state.get("residual")
        self.residual = None if res is None else res.clone()
