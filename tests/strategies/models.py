"""Small models for multi-process tests, loadable as ``--model tests.strategies.models:NAME``."""

from __future__ import annotations

from torch import nn

from disttrain.models import mlp

__all__ = ["small_mlp"]


def small_mlp() -> nn.Module:
    """64 -> 32 -> 32 -> 10 for digits: fast enough for tests, several buckets at 1 kB."""
    return mlp(64, 10, hidden=(32, 32))
