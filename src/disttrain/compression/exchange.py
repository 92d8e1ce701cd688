"""Moving payloads: to peers point to point (sparse codes) or through any allreduce (dense casts).

Sparse payloads are not summable in place (different indices on each worker),
so they are sent to each peer and summed after decoding. Their length varies,
so each payload is preceded by its length as one int32 (``LENGTH_BYTES``), so
the receiver can post a receive of the right size; casts have a known length
and send no prefix. Everything goes through :mod:`disttrain.comm.p2p` or a
registered allreduce algorithm, so the one meter sees every byte, and
:class:`CompressionStats` compares it with what dense fp32 would have cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed import ProcessGroup

from disttrain import collectives
from disttrain.comm import p2p
from disttrain.comm.meter import meter
from disttrain.compression.base import Compressor, Payload
from disttrain.compression.error_feedback import ErrorFeedback

__all__ = [
    "LENGTH_BYTES",
    "CompressionStats",
    "all_peers",
    "compressed_all_reduce",
    "exchange_payloads",
]

#: Bytes of the length prefix sent before each variable-size payload.
LENGTH_BYTES = 4


@dataclass
class CompressionStats:
    """Bytes dense fp32 would have sent for the same exchanges, and bytes actually sent."""

    dense_bytes: int = 0
    sent_bytes: int = 0
    exchanges: int = 0

    @property
    def ratio(self) -> float:
        """dense fp32 bytes / bytes actually sent (nan before anything was sent)."""
        return self.dense_bytes / self.sent_bytes if self.sent_bytes else float("nan")


def all_peers(rank: int, size: int) -> tuple[list[int], list[int]]:
    """Round r sends to rank+r and receives from rank-r: every pair once, no deadlock."""
    return [(rank + r) % size for r in range(1, size)], [(rank - r) % size for r in range(1, size)]


def exchange_payloads(
    payload: Payload,
    compressor: Compressor,
    send_to: list[int],
    recv_from: list[int],
    group: ProcessGroup | None = None,
) -> list[Payload]:
    """Send ``payload`` to ``send_to[r]`` while receiving from ``recv_from[r]``, round by round."""
    fixed = compressor.fixed_wire_numel(payload.numel)
    received: list[Payload] = []
    for dst, src in zip(send_to, recv_from, strict=True):
        length = fixed
        if length is None:
            theirs = torch.empty(1, dtype=torch.int32)
            mine = torch.tensor([payload.data.numel()], dtype=torch.int32)
            p2p.exchange(mine, dst, theirs, src, group)
            length = int(theirs[0])
        buf = torch.empty(length, dtype=compressor.wire_dtype)
        p2p.exchange(payload.data, dst, buf, src, group)
        received.append(compressor.from_wire(buf, payload.numel))
    return received


def compressed_all_reduce(
    flat: torch.Tensor,
    compressor: Compressor,
    algorithm: str = "native",
    group: ProcessGroup | None = None,
    feedback: ErrorFeedback | None = None,
    stats: CompressionStats | None = None,
) -> torch.Tensor:
    """Sum the compressed ``flat`` of every rank into ``flat`` (in place) and return it.

    Summable casts ride ``algorithm`` (their sum is taken in the 16-bit type);
    sparse payloads go to every peer and are summed after decoding. With
    ``feedback``, what this rank's payload left out stays in its residual.
    """
    size = p2p.group_size(group)
    rank = p2p.group_rank(group)
    before = meter.bytes_sent
    if feedback is not None:
        payload, mine = feedback.compress(flat)
    else:
        payload, mine = compressor.compress_and_decode(flat)
    dense = 4 * flat.numel()
    if compressor.summable:
        if size > 1:
            collectives.all_reduce(payload.data, algorithm, group)
        result = compressor.decompress(payload)
        dense_sent = collectives.get(algorithm).cost(dense, size, rank, itemsize=4).bytes_sent
    else:
        send_to, recv_from = all_peers(rank, size)
        result = mine.clone()
        for theirs in exchange_payloads(payload, compressor, send_to, recv_from, group):
            result += compressor.decompress(theirs)
        dense_sent = dense * (size - 1)
    flat.copy_(result.view_as(flat))
    if stats is not None:
        stats.dense_bytes += dense_sent
        stats.sent_bytes += meter.bytes_sent - before
        stats.exchanges += 1
    return flat
