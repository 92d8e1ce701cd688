"""A small character-level GPT (nanoGPT's shape) as a sequence of blocks, so it can be pipelined.

    Sequential(Embed, Block x n_layer, Head)

Each block is pre-LayerNorm causal self-attention then an MLP, both residual.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from disttrain.comm.errors import UsageError
from disttrain.data.datasets import Dataset
from disttrain.models.base import MODELS

__all__ = ["Block", "Embed", "Head", "flops_per_token", "gpt"]


class Embed(nn.Module):
    """Token plus learned position embeddings."""

    def __init__(self, vocab: int, seq_len: int, dim: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq_len, dim)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(positions)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Head(nn.Module):
    """Final LayerNorm and the projection to vocabulary logits."""

    def __init__(self, dim: int, vocab: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.lm = nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm(self.ln(x))


def gpt(
    vocab: int = 256, seq_len: int = 64, dim: int = 128, heads: int = 4, layers: int = 4
) -> nn.Sequential:
    """A GPT of ``layers`` blocks: 0.87M parameters at the defaults."""
    return nn.Sequential(
        Embed(vocab, seq_len, dim), *(Block(dim, heads) for _ in range(layers)), Head(dim, vocab)
    )


def flops_per_token(model: nn.Module, seq_len: int) -> float:
    """Training FLOPs per token (PaLM's appendix B): 6 x the parameters that multiply (all
    but the embeddings) + 12 x blocks x context x width (attention's two matmuls), for MFU."""
    embedded = sum(
        p.numel() for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()
    )
    n = sum(p.numel() for p in model.parameters()) - embedded
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    width = blocks[0].qkv.in_features if blocks else 0
    return 6.0 * n + 12.0 * len(blocks) * seq_len * width


@MODELS.register("gpt")
def _gpt(data: Dataset) -> nn.Module:
    if data.task != "lm":
        raise UsageError("--model gpt needs a language-model data set: use --dataset pycode")
    # a language-model sample is one window of --seq-len tokens: the context the model needs
    return gpt(vocab=data.num_classes, seq_len=int(data.x_train.shape[-1]))


@MODELS.register("gpt2-small")
def _gpt2_small(data: Dataset) -> nn.Module:
    """GPT-2 small's blocks (12 layers, 768 wide, 12 heads: 85M parameters in the blocks).

    The vocabulary and context are the data set's (pycode: 256 bytes; ``--seq-len 1024``
    for GPT-2's context), so the embeddings and head are smaller than GPT-2's 50,257 tokens.
    """
    if data.task != "lm":
        raise UsageError("--model gpt2-small needs a language-model data set: use --dataset pycode")
    return gpt(
        vocab=data.num_classes, seq_len=int(data.x_train.shape[-1]), dim=768, heads=12, layers=12
    )
