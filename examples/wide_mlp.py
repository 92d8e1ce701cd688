"""A 96.7M-parameter MLP for digits, to show ZeRO stage 3 training what does not fit replicated.

    prlimit --data=$((1400 * 2**20)) disttrain train --model examples.wide_mlp:wide_mlp \
        --strategy zero --zero-stage 3 --optimizer adam --lr 1e-4 --workers 4 --max-steps 5

64 -> 24 x 2048 -> 10: Ψ = 96.7M parameters, 387 MB in fp32. Replicated Adam holds
16Ψ = 1,547 MB per worker (parameters, gradients, two moments); ZeRO stage 3 on 4 workers
16Ψ/4 = 387 MB plus the layers gathered at once. docs/zero.md, "A model that does not fit".
"""

from __future__ import annotations

from torch import nn

from disttrain.models import mlp

__all__ = ["wide_mlp"]


def wide_mlp(in_features: int, num_classes: int) -> nn.Module:
    """24 hidden layers of 2048: the 23 square 2048 x 2048 weights carry 99.8 % of them."""
    return mlp(in_features, num_classes, hidden=(2048,) * 24)
