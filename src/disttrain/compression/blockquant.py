"""4-bit block quantization (absmax per block of 64): DiLoCo's ``--outer-dtype int4``.

Each block of ``BLOCK`` entries is sent as one fp32 scale ``s = max|x| / 7`` and
the codes ``q = round(x / s)`` in -7..7, two to a byte (stored as q + 8; the
sixteenth code is unused so that zero is exact and the grid symmetric):
4 + 64/2 = 36 bytes per 64 entries, 7.1x fewer than fp32. Round to nearest,
no error feedback (streaming DiLoCo's 4-bit outer gradients, Douillard et al.
2025, have none): each decoded entry is within s/2 = max|x|/14 of its value.

The codes are not summable (each block has its own scale), so a sum over
workers gathers every worker's payload and adds the decodes in rank order
(the same float additions on every rank: equal replicas). A ring all-gather
sends (n-1) payloads per rank where a ring allreduce of fp32 sends 2(n-1)/n
of the tensor: fewer bytes only while n < 2·4·64/36 ≈ 14 (4 workers: 3.6x
fewer than fp32, 1.8x fewer than bf16; 8 workers: 1.8x fewer than fp32, 1.1x
bf16's bytes).
"""

from __future__ import annotations

import torch

__all__ = ["BLOCK", "decode", "encode", "payload_bytes"]

BLOCK = 64
LEVELS = 7  # codes -7..7


def _blocks(numel: int) -> int:
    return -(-numel // BLOCK)


def payload_bytes(numel: int) -> int:
    """Bytes of the payload of ``numel`` entries: one fp32 scale and BLOCK/2 bytes per block."""
    return _blocks(numel) * (4 + BLOCK // 2)


def encode(x: torch.Tensor) -> torch.Tensor:
    """The uint8 payload of the flat float tensor ``x``: the scales' bytes, then the codes."""
    flat = x.detach().reshape(-1).float()
    nb = _blocks(flat.numel())
    padded = torch.zeros(nb * BLOCK)
    padded[: flat.numel()] = flat
    blocks = padded.view(nb, BLOCK)
    scale = blocks.abs().amax(dim=1) / LEVELS
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero block: codes 0
    codes = (torch.round(blocks / safe[:, None]).clamp_(-LEVELS, LEVELS) + 8).to(torch.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return torch.cat([scale.view(torch.uint8), packed.reshape(-1)])


def decode(payload: torch.Tensor, numel: int) -> torch.Tensor:
    """The fp32 tensor of ``numel`` entries that ``payload`` (from :func:`encode`) stands for."""
    nb = _blocks(numel)
    if payload.numel() != payload_bytes(numel):
        raise ValueError(
            f"an int4 payload of {numel} entries has {payload_bytes(numel)} bytes, "
            f"got {payload.numel()}"
        )
    scale = payload[: 4 * nb].clone().view(torch.float32)
    packed = payload[4 * nb :].view(nb, BLOCK // 2)
    codes = torch.empty(nb, BLOCK, dtype=torch.uint8)
    codes[:, 0::2] = packed & 0x0F
    codes[:, 1::2] = packed >> 4
    values = (codes.float() - 8) * scale[:, None]
    return values.reshape(-1)[:numel]
