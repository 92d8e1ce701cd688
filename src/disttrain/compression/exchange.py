"""Moving payloads: to peers point to point (sparse codes) or through any allreduce (dense casts).

Sparse payloads are not summable in place (different indices on each worker),
so they are sent to each peer and summed after decoding. Their length varies,
so each payload is preceded by its length as one int32 (``LENGTH_BYTES``), so
the receiver can post a receive of the right size; casts have a known length
and send no prefix. Everything goes through :mod:`disttrain.comm.p2p` or a
registered allreduce algorithm, so the one meter sees every byte, and
:class:`CompressionStats` compares it with two dense fp32 references: the same
exchange with fp32 payloads (``payload_compression``) and the dense allreduce of
the same gradient that a run without compression would do (``vs_dense_allreduce``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch.distributed import ProcessGroup

from disttrain import collectives
from disttrain.comm import p2p, phases
from disttrain.comm.meter import meter
from disttrain.compression.base import CollectiveCompressor, Compressor, Payload
from disttrain.compression.error_feedback import ErrorFeedback
from disttrain.compression.starved import StarvedCheck

__all__ = [
    "LENGTH_BYTES",
    "CompressionStats",
    "all_peers",
    "compressed_all_reduce",
    "compression_figures",
    "dense_allreduce_bytes",
    "exchange_payloads",
]

#: Bytes of the length prefix sent before each variable-size payload.
LENGTH_BYTES = 4

#: Per collective compressor, the round lengths (``round_numels``) every rank has checked.
_AGREED: weakref.WeakKeyDictionary[CollectiveCompressor, set[tuple[int, ...]]] = (
    weakref.WeakKeyDictionary()
)


@dataclass
class CompressionStats:
    """Bytes this rank sent, and what two dense fp32 references would have sent instead."""

    #: the same exchanges (same peers, same allreduce) with each payload dense fp32
    dense_bytes: int = 0
    #: a dense fp32 allreduce of the same gradients (the algorithm's ``cost()``): what a
    #: run without compression sends per rank (2(n-1)/n of the gradient for a ring)
    allreduce_bytes: int = 0
    #: bytes the meter saw (length prefixes included)
    sent_bytes: int = 0
    exchanges: int = 0
    #: warns once if a sparse compressor sends almost nothing (its payloads: ``count``)
    starved: StarvedCheck = field(default_factory=lambda: StarvedCheck(None))

    @property
    def payload_compression(self) -> float:
        """dense fp32 bytes / bytes sent, for the same exchanges (nan before any was sent)."""
        return self.dense_bytes / self.sent_bytes if self.sent_bytes else float("nan")

    @property
    def vs_dense_allreduce(self) -> float:
        """A dense allreduce's bytes / bytes sent: how many times fewer than uncompressed."""
        return self.allreduce_bytes / self.sent_bytes if self.sent_bytes else float("nan")

    def add(self, dense: int, allreduce: int, sent: int) -> None:
        """Count one exchange: its two dense references and the bytes the meter saw."""
        self.dense_bytes += dense
        self.allreduce_bytes += allreduce
        self.sent_bytes += sent
        self.exchanges += 1


def compression_figures(stats: CompressionStats) -> dict[str, float]:
    """The two ratios as summary.json and metrics.jsonl name them (docs/compression.md)."""
    return {
        "payload_compression": stats.payload_compression,
        "bytes_vs_dense_allreduce": stats.vs_dense_allreduce,
    }


def dense_allreduce_bytes(
    numel: int, size: int, rank: int, algorithm: collectives.Algorithm
) -> int:
    """Bytes ``rank`` sends in a dense fp32 allreduce of ``numel`` entries with ``algorithm``."""
    return collectives.resolve(algorithm).cost(4 * numel, size, rank, itemsize=4).bytes_sent


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
        received.append(Payload(buf, payload.numel))
    return received


def compressed_all_reduce(
    flat: torch.Tensor,
    compressor: Compressor,
    algorithm: collectives.Algorithm = "native",
    group: ProcessGroup | None = None,
    feedback: ErrorFeedback | None = None,
    stats: CompressionStats | None = None,
    mean: bool = False,
) -> torch.Tensor:
    """Sum the compressed ``flat`` of every rank into ``flat`` (in place) and return it;
    with ``mean``, the mean (a collective compressor writes it at once: no × n, ÷ n).

    Summable casts ride ``algorithm`` (their sum is taken in the 16-bit type);
    sparse payloads go to every peer and are summed after decoding. With
    ``feedback``, what this rank's payload left out stays in its residual.
    """
    if flat.is_cuda:  # the codecs encode on the host (numpy): staged there and back
        host = flat.detach().cpu()
        compressed_all_reduce(host, compressor, algorithm, group, feedback, stats, mean)
        return flat.copy_(host)
    size = p2p.group_size(group)
    rank = p2p.group_rank(group)
    before = meter.bytes_sent
    allreduce_sent = dense_allreduce_bytes(flat.numel(), size, rank, algorithm)
    if isinstance(compressor, CollectiveCompressor):  # its own rounds of allreduces (PowerSGD)
        _collective_rounds(flat, compressor, algorithm, group, feedback, size, mean)
        if stats is not None:  # fp32 payloads already: the reference is the dense allreduce
            stats.add(allreduce_sent, allreduce_sent, meter.bytes_sent - before)
        return flat
    # encoding and decoding are booked as codec time, apart from the exchange (phases)
    with phases.book(phases.CODEC):
        if feedback is not None:
            payload, mine = feedback.compress(flat)
        else:
            payload, mine = compressor.compress_and_decode(flat)
    if stats is not None:
        stats.starved.count(payload)
    if compressor.summable:
        if size > 1:
            collectives.all_reduce(payload.data, algorithm, group)
        with phases.book(phases.CODEC):
            result = compressor.decompress(payload)
        dense_sent = allreduce_sent  # the same allreduce, in fp32
    else:
        result = _sum_from_peers(payload, mine, compressor, group, rank, size)
        dense_sent = 4 * flat.numel() * (size - 1)  # an fp32 tensor to each peer
    flat.copy_(result.view_as(flat))
    if mean:
        flat.div_(size)
    if stats is not None:
        stats.add(dense_sent, allreduce_sent, meter.bytes_sent - before)
    return flat


def _collective_rounds(
    flat: torch.Tensor,
    compressor: CollectiveCompressor,
    algorithm: collectives.Algorithm,
    group: ProcessGroup | None,
    feedback: ErrorFeedback | None,
    size: int,
    mean: bool,
) -> None:
    """A collective compressor's own rounds of allreduces, summed into ``flat`` in place.

    The compressor writes the mean; the sum is the mean × size (exact for a
    power-of-two size; else one rounding of the mean).
    """
    # The rounds' lengths follow from the bound shapes and the step: the algorithms'
    # cross-rank length check (a blocking allreduce of its own before each round: three
    # extra latencies a step) runs until every rank has agreed on them once.
    rounds = tuple(compressor.round_numels(flat.numel()))
    agreed = _AGREED.setdefault(compressor, set())
    checked = rounds not in agreed
    algo = collectives.resolve(algorithm)

    def sum_(t: torch.Tensor) -> None:
        if size > 1:
            algo.all_reduce(t, group, checked=checked)

    in_place = flat.dtype == torch.float32  # else the fp32 sum is copied back at the end
    out = flat.view(-1) if in_place else torch.empty(flat.numel())

    def run(acc: torch.Tensor) -> tuple[None, torch.Tensor]:
        return None, compressor.reduce(acc, sum_, size, out)

    if feedback is not None:
        feedback.apply(flat, run)
    else:
        run(flat.detach().reshape(-1).float())
    agreed.add(rounds)
    if not mean:
        out.mul_(size)  # exact for a power-of-two size; else one rounding of the mean
    if not in_place:
        flat.copy_(out.view_as(flat))


def _sum_from_peers(
    payload: Payload,
    mine: torch.Tensor,
    compressor: Compressor,
    group: ProcessGroup | None,
    rank: int,
    size: int,
) -> torch.Tensor:
    """Send a sparse payload to every peer, decode theirs, and sum the decodes in rank order.

    Rank order on every rank gives bit-identical sums, so the replicas stay equal.
    """
    send_to, recv_from = all_peers(rank, size)
    got = exchange_payloads(payload, compressor, send_to, recv_from, group)
    with phases.book(phases.CODEC):  # decoding each payload and summing the decodes
        decoded = {s: compressor.decompress(p) for s, p in zip(recv_from, got, strict=True)}
        decoded[rank] = mine
        result = torch.zeros_like(mine)
        for r in range(size):  # in rank order on every rank: bit-identical sums, equal replicas
            result += decoded[r]
    return result
