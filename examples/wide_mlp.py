"""A 29.5M-parameter MLP for digits, to show ZeRO stage 3 training what does not fit replicated.

    prlimit --data=$((600 * 2**20)) disttrain train --model examples.wide_mlp:wide_mlp \
        --strategy zero --zero-stage 3 --optimizer adam --lr 1e-4 --workers 4 --max-steps 5

64 -> 8 x 2048 -> 10: Ψ = 29.5M parameters, 118 MB in fp32. Replicated Adam holds
16Ψ = 472 MB per worker (parameters, gradients, two moments); ZeRO stage 3 on 4 workers
16Ψ/4 = 118 MB plus the layers gathered at once. docs/zero.md, "A model that does not fit".
Eight layers, not more: the docs' test runs this pair, and its CPU grows with Ψ.
"""

from __future__ import annotations

from torch import nn

from disttrain.models import mlp

__all__ = ["wide_mlp"]


def wide_mlp(in_features: int, num_classes: int) -> nn.Module:
    """8 hidden layers of 2048: the 7 square 2048 x 2048 weights carry 99.5 % of them."""
    return mlp(in_features, num_classes, hidden=(2048,) * 8)
