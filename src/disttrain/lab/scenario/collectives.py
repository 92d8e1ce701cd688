"""NCCL's ring and tree on the two-level topology: GPUs on a fast link inside a node, the
nodes' NICs between them. Times in seconds for a buffer of ``size`` bytes per rank.

The bandwidth terms are the classic ones (Thakur, Rabenseifner & Gropp 2005; Patarasuk &
Yuan 2009): a ring allreduce sends 2(n-1)/n of the buffer through every rank's link in
2(n-1) steps, each step paying the slowest hop's latency. Across nodes every node's NICs
carry that same 2(n-1)/n share for each ring (NCCL runs one ring per NIC, so together
they use all of them), so the bottleneck is the slower of a GPU's intra-node link and its
share of the node's NICs. A tree (NCCL >= 2.4's double binary tree) moves twice the
buffer through each node's NICs (once on two nodes) in 2 log2(nodes) network steps, plus a
chain through the node's GPUs. Latencies and the tree's derating across nodes are NCCL's
own tuner's (below); what the NICs deliver is hardware.inter_node's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Group", "allgather", "allreduce", "p2p", "ring_allreduce", "tree_allreduce"]

#: Across nodes, NCCL's own tuner (src/graph/tuning.cc, https://github.com/NVIDIA/nccl/blob/
#: master/src/graph/tuning.cc, Simple protocol) sets a ring's latency to
#:   plateau * (RING_BASE + inter_steps * net_latency + intra_steps * max(intra, NET_OVERHEAD))
#: (baseLat[RING][SIMPLE] = 8.4 us; each intra-node step costs at least 3 x the 1 us network
#: post overhead once the ring crosses nodes), the plateau being the intra link's
#: (IntraLink.ring_plateau, allreduce only). A tree's bandwidth is 0.92 of the ring's
#: (``busBw*.92``) times NCCL's measured correction for medium sizes (TREE_CORRECTION), and
#: each of its hops costs TREE_HOP (hwLat[*][TREE][SIMPLE] = 28 us, "the latency [of] a 256kB
#: chunk"). Inside one node nothing of this applies: the ring keeps its per-hop latency.
RING_BASE = 8.4e-6
NET_OVERHEAD = 3e-6
TREE_BANDWIDTH = 0.92
TREE_HOP = 28e-6
#: treeCorrectionFactor[SIMPLE] of tuning.cc: powers of two from 64 B to 256 MB; 1 beyond.
TREE_CORRECTION: tuple[float, ...] = (
    (0.9,) * 7 + (0.8, 0.7, 0.6, 0.6) + (0.5,) * 4 + (0.6, 0.7, 0.8, 0.7, 0.7, 0.8, 0.9, 0.9)
)


@dataclass(frozen=True)
class Group:
    """One collective's ranks: ``ranks`` in all, ``per_node`` of them on each node;
    ``sharing`` groups on each node run the same collective at once over its NICs, each
    through its own connections, which carry at most ``net_cap`` (hardware.inter_node)."""

    ranks: int
    per_node: int
    intra_bandwidth: float  # bytes/s per GPU, achieved
    intra_latency: float
    net_bandwidth: float = 0.0  # bytes/s per node, achieved (0: one node)
    net_latency: float = 0.0
    sharing: int = 1
    net_cap: float = math.inf  # bytes/s per node one collective's connections carry
    plateau: float = 1.0  # NCCL's ring latency factor across nodes (IntraLink.ring_plateau)

    @property
    def nodes(self) -> int:
        return max(1, math.ceil(self.ranks / max(1, self.per_node)))

    @property
    def net_rate(self) -> float:
        """This group's share of the node's NICs, at most what its connections carry."""
        return min(self.net_bandwidth / self.sharing, self.net_cap)

    @property
    def bandwidth(self) -> float:
        """The bottleneck rate per rank: the intra link, or this group's share of the NICs."""
        if self.nodes == 1:
            return self.intra_bandwidth
        return min(self.intra_bandwidth, self.net_rate)


def _ring_latency(g: Group, steps_per_rank: int) -> float:
    """A pipelined ring's chunk crosses every rank: of its steps_per_rank*(n-1) hops,
    steps_per_rank*(nodes-1) are network hops and the rest intra-node ones (NCCL's tuner
    splits a ring's steps the same way into inter- and intra-node latencies)."""
    inter = steps_per_rank * (g.nodes - 1)
    intra = steps_per_rank * (g.ranks - 1) - inter
    if g.nodes == 1:
        return intra * g.intra_latency
    plateau = g.plateau if steps_per_rank == 2 else 1.0
    hops = inter * g.net_latency + intra * max(g.intra_latency, NET_OVERHEAD)
    return plateau * (RING_BASE + hops)


def ring_allreduce(size: float, g: Group) -> float:
    """2(n-1) hops of latency, 2(n-1)/n of the buffer through the bottleneck."""
    n = g.ranks
    if n <= 1 or size <= 0:
        return 0.0
    return _ring_latency(g, 2) + 2 * (n - 1) / n * size / g.bandwidth


def _tree_correction(size: float) -> float:
    k = int(math.log2(max(1.0, size / 64)))
    return TREE_CORRECTION[k] if k < len(TREE_CORRECTION) else 1.0


def tree_allreduce(size: float, g: Group) -> float:
    """Reduce up, broadcast down: 2 log2(nodes) network hops and a 2(k-1)-hop chain inside
    the node, TREE_HOP each (or the network's own latency if longer). Each node's NICs
    carry the buffer twice (up and down), but only once on two nodes, where each of the
    two trees is one hop (NVIDIA: "the inter-node link will see only 1/2*size in the
    two-node case", https://github.com/NVIDIA/nccl/issues/209#issuecomment-498745923);
    each GPU's intra link carries it twice."""
    if g.ranks <= 1 or size <= 0:
        return 0.0
    if g.nodes == 1:
        return ring_allreduce(size, g)
    hops = 2 * math.ceil(math.log2(g.nodes)) * max(TREE_HOP, g.net_latency)
    chain = 2 * (g.per_node - 1) * TREE_HOP
    net_bytes = size if g.nodes == 2 else 2 * size
    seconds = max(net_bytes / g.net_rate, 2 * size / g.intra_bandwidth)
    return hops + chain + seconds / (TREE_BANDWIDTH * _tree_correction(size))


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
