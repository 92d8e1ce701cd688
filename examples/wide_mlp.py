"""A 50.6M-parameter MLP for digits, to show ZeRO stage 3 training what does not fit replicated.

    prlimit --data=$((900 * 2**20)) disttrain train --model examples.wide_mlp:wide_mlp \
        --strategy zero --zero-stage 3 --optimizer adam --workers 4 --max-steps 5

64 -> 4096 -> 4096 -> 4096 -> 4096 -> 10: Ψ = 50.6M parameters, 202 MB in fp32. Replicated
Adam holds 16Ψ = 810 MB per worker (parameters, gradients, two moments); ZeRO stage 3 on
4 workers 16Ψ/4 = 202 MB plus the two largest layers gathered at once (2 x 67 MB).
docs/zero.md, "A model that does not fit".
"""

from __future__ import annotations

from torch import nn

from disttrain.models import mlp

__all__ = ["wide_mlp"]


def wide_mlp(in_features: int, num_classes: int) -> nn.Module:
    """Four hidden layers of 4096: three 4096 x 4096 weights carry 99 % of the parameters."""
    return mlp(in_features, num_classes, hidden=(2048,) * 24)
