"""NCCL's ring and tree on the two-level topology: GPUs on a fast link inside a node, the
nodes' NICs between them. Times in seconds for a buffer of ``size`` bytes per rank.

The bandwidth terms are the classic ones (Thakur, Rabenseifner & Gropp 2005; Patarasuk &
Yuan 2009): a ring allreduce sends 2(n-1)/n of the buffer through every rank's link in
2(n-1) steps, each step paying the slowest hop's latency. Across nodes every node's NICs
carry that same 2(n-1)/n share for each ring (NCCL runs one ring per NIC, so together
they use all of them), so the bottleneck is the slower of a GPU's intra-node link and its
share of the node's NICs. A tree (NCCL >= 2.4's double binary tree) moves the same bytes
per node but in 2 log2(nodes) network steps, plus a chain through the node's GPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Group", "allgather", "allreduce", "p2p", "ring_allreduce", "tree_allreduce"]

#: A tree reaches a little less bandwidth than a ring on large buffers (its pipeline
#: has more stages and the root's links do double duty); NCCL's own tuner rates it
#: below the ring for large sizes. Assumed, not fitted.
TREE_BANDWIDTH = 0.9


@dataclass(frozen=True)
class Group:
    """One collective's ranks: ``ranks`` in all, ``per_node`` of them on each node;
    ``sharing`` groups on each node run the same collective at once over its NICs."""

    ranks: int
    per_node: int
    intra_bandwidth: float  # bytes/s per GPU, achieved
    intra_latency: float
    net_bandwidth: float = 0.0  # bytes/s per node, achieved (0: one node)
    net_latency: float = 0.0
    sharing: int = 1

    @property
    def nodes(self) -> int:
        return max(1, math.ceil(self.ranks / max(1, self.per_node)))

    @property
    def bandwidth(self) -> float:
        """The bottleneck rate per rank: the intra link, or this group's share of the NICs."""
        if self.nodes == 1:
            return self.intra_bandwidth
        return min(self.intra_bandwidth, self.net_bandwidth / self.sharing)


def _ring_latency(g: Group, steps_per_rank: int) -> float:
    """A pipelined ring's chunk crosses every rank: of its steps_per_rank*(n-1) hops,
    steps_per_rank*(nodes-1) are network hops and the rest intra-node ones (NCCL's tuner
    splits a ring's steps the same way into inter- and intra-node latencies)."""
    inter = steps_per_rank * (g.nodes - 1)
    intra = steps_per_rank * (g.ranks - 1) - inter
    return inter * g.net_latency + intra * g.intra_latency


def ring_allreduce(size: float, g: Group) -> float:
    """2(n-1) hops of latency, 2(n-1)/n of the buffer through the bottleneck."""
    n = g.ranks
    if n <= 1 or size <= 0:
        return 0.0
    return _ring_latency(g, 2) + 2 * (n - 1) / n * size / g.bandwidth


def tree_allreduce(size: float, g: Group) -> float:
    """Reduce up, broadcast down: 2 log2(nodes) network hops and a 2(k-1)-hop chain inside
    the node; each node's NICs carry the buffer twice (up and down)."""
    if g.ranks <= 1 or size <= 0:
        return 0.0
    if g.nodes == 1:
        return ring_allreduce(size, g)
    hops = 2 * math.ceil(math.log2(g.nodes)) * g.net_latency
    chain = 2 * (g.per_node - 1) * g.intra_latency
    return hops + chain + 2 * size / (g.bandwidth * TREE_BANDWIDTH)


def allreduce(size: float, g: Group, library: str) -> tuple[float, str]:
    """NCCL picks the faster of ring and tree per size (its tuner); gloo and MPI (as
    Horovod and Gloo use them for large buffers) run a ring."""
    ring = ring_allreduce(size, g)
    if library != "nccl" or g.nodes == 1:
        return ring, "ring"
    tree = tree_allreduce(size, g)
    return (tree, "tree") if tree < ring else (ring, "ring")


def allgather(size: float, g: Group) -> float:
    """Ring all-gather (or reduce-scatter) of a ``size``-byte full buffer: n-1 steps and
    (n-1)/n of the buffer, half an allreduce."""
    n = g.ranks
    if n <= 1 or size <= 0:
        return 0.0
    return _ring_latency(g, 1) + (n - 1) / n * size / g.bandwidth


def p2p(size: float, bandwidth: float, latency: float) -> float:
    """One send of ``size`` bytes: latency plus size over the link's rate."""
    return latency + size / bandwidth if size > 0 else 0.0
