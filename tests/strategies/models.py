"""Small models for multi-process tests, loadable as ``--model tests.strategies.models:NAME``."""

from __future__ import annotations

from torch import nn

from disttrain.models import gpt, mlp

__all__ = ["small_gpt", "small_mlp"]


def small_mlp() -> nn.Module:
    """64 -> 32 -> 32 -> 10 for digits: fast enough for tests, several buckets at 1 kB."""
    return mlp(64, 10, hidden=(32, 32))


def small_gpt(vocab: int, seq_len: int) -> nn.Module:
    """The registered gpt's blocks at width 32, 2 heads, 2 layers: 43k parameters at vocab 256."""
    return gpt(vocab=vocab, seq_len=seq_len, dim=32, heads=2, layers=2)
