"""The critical path of one allreduce (steps, bytes, reduced bytes), from each algorithm's cost().

Each algorithm states what ONE rank sends (:meth:`AllReduceAlgorithm.cost`: bytes and
messages). Time is set by the longest chain of dependent transfers, which is not always
one rank's own sends: a folded butterfly waits for the rank that sits out, a tree node
waits for its children level after level, the star's root first receives everything
and then sends everything. This module turns the stated costs into that chain:

    time = steps·α + critical_bytes·β + reduced_bytes·γ

(α: seconds per message, β: seconds per byte on a link, γ: seconds per byte added
in memory). The byte and message counts always come from ``cost()``; what is added
here is only which of them follow one another. Links are full duplex (each rank
sends and receives at the same time, as the emulated cluster's shaping does).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from disttrain import collectives
from disttrain.collectives.base import Cost
from disttrain.collectives.folding import Fold

__all__ = ["Path", "critical_path", "max_rank_cost"]


@dataclass(frozen=True)
class Path:
    """What one allreduce costs on its critical path, and the formula in words."""

    steps: int  # messages one after the other: each pays α
    critical_bytes: int  # bytes through the busiest link on the path: each pays β
    reduced_bytes: int  # bytes added into the result on the path: each pays γ
    bytes_per_rank: int  # the most any rank sends (cost(), for the byte meter)
    messages_per_rank: int  # the most messages any rank sends (cost())
    latency_formula: str
    bandwidth_formula: str
    total_messages: int = 0  # over all ranks (cost() summed)
    total_bytes: int = 0

    def seconds(self, alpha: float, beta: float, gamma: float) -> float:
        return self.steps * alpha + self.critical_bytes * beta + self.reduced_bytes * gamma

    def shared_seconds(self, alpha: float, delta: float, beta: float) -> float:
        """Ranks sharing one host's cores: every message and byte of every rank is CPU work.

        steps·α (each step waits for its peers to be scheduled) + all messages·δ + all
        bytes·β: on loopback a transfer is a copy by the kernel on the same cores.
        """
        return self.steps * alpha + self.total_messages * delta + self.total_bytes * beta


def _ranks(n: int) -> list[int]:
    """Ranks whose costs bound every rank's (computing all n is O(n²) at n = 10,000).

    Chunked algorithms give the first ``numel % n`` chunks one element more, so the
    extremes sit at the start and near the end; the fold's pairs sit at the start.
    Beyond 64 ranks only the three that matter most are computed (O(n) each).
    """
    picks = (0, 1, 2, 3, n // 2, n - 3, n - 2, n - 1) if n <= 64 else (0, 1, n - 3)
    return sorted({r for r in picks if 0 <= r < n})


@lru_cache(maxsize=8192)
def _cost(algorithm: str, nbytes: int, n: int, rank: int, itemsize: int) -> Cost:
    return collectives.get(algorithm).cost(nbytes, n, rank, itemsize)


def max_rank_cost(algorithm: str, nbytes: int, n: int, itemsize: int = 4) -> Cost:
    """The most bytes (and messages) any rank sends, over the representative ranks."""
    costs = [_cost(algorithm, nbytes, n, r, itemsize) for r in _ranks(n)]
    return Cost(max(c.bytes_sent for c in costs), max(c.messages for c in costs))


@lru_cache(maxsize=4096)  # buckets repeat one size; n = 10,000 costs O(n) per rank
def critical_path(algorithm: str, nbytes: int, n: int, itemsize: int = 4) -> Path:
    """The critical path of one allreduce of ``nbytes`` on ``n`` ranks with ``algorithm``."""
    path = _path(algorithm, nbytes, n, itemsize)
    algo = collectives.get(algorithm)
    if n <= 64:  # exact sums; beyond, n times the busiest rank (an upper bound)
        costs = [algo.cost(nbytes, n, r, itemsize) for r in range(n)]
        total = Cost(sum(c.bytes_sent for c in costs), sum(c.messages for c in costs))
    else:
        total = Cost(n * path.bytes_per_rank, n * path.messages_per_rank)
    return replace(path, total_messages=total.messages, total_bytes=total.bytes_sent)


def _path(algorithm: str, nbytes: int, n: int, itemsize: int) -> Path:
    most = max_rank_cost(algorithm, nbytes, n, itemsize)
    if n <= 1 or nbytes == 0:
        return Path(0, 0, 0, 0, 0, "nothing to send", "nothing to send")
    c0 = _cost(algorithm, nbytes, n, 0, itemsize)
    if algorithm in ("ring", "roundrobin", "native"):
        # Every step waits for the previous one; half of what arrives (the
        # reduce-scatter) is added. native is gloo's ring for these sizes.
        return Path(c0.messages, most.bytes_sent, most.bytes_sent // 2, most.bytes_sent,
                    most.messages, f"2(n−1) = {c0.messages} steps",
                    "2(n−1)/n·S")  # fmt: skip
    if algorithm in ("butterfly", "halving_doubling"):
        fold = Fold(0, n)
        if fold.extra:
            # rank 0 sits out: it hands its array to rank 1 first (its cost), and rank 1's
            # own cost holds the power-of-two phase and the hand-back.
            sitter, absorber = c0, _cost(algorithm, nbytes, n, 1, itemsize)
            chain = sitter + absorber
            added = absorber.bytes_sent - nbytes + sitter.bytes_sent
            steps = chain.messages
        else:
            chain = c0
            added = c0.bytes_sent
            steps = c0.messages
        if algorithm == "halving_doubling":  # only the recursive-halving half is added
            added = (chain.bytes_sent - (2 * nbytes if fold.extra else 0)) // 2 + (
                nbytes if fold.extra else 0
            )
        lat = "log2(n)" if algorithm == "butterfly" else "2·log2(n)"
        bw = "log2(n)·S" if algorithm == "butterfly" else "2(n−1)/n·S"
        fold_note = " + 2 fold steps" if fold.extra else ""
        bw += " + 2S" if fold.extra else ""
        return Path(steps, chain.bytes_sent, added, most.bytes_sent, most.messages,
                    f"{lat}{fold_note} = {steps} steps", bw)  # fmt: skip
    if algorithm == "tree":
        # Level by level: up the tree a parent receives its children's arrays (the
        # root's cost: S per child) and adds them; down it sends them the sum.
        depth = n.bit_length() - 1
        return Path(2 * depth, 2 * depth * c0.bytes_sent, depth * c0.bytes_sent,
                    most.bytes_sent, most.messages, f"2·log2(n) = {2 * depth} steps",
                    "2·log2(n)·2S")  # fmt: skip
    if algorithm == "star":
        # The root receives what every leaf sends ((n-1)·S, as much as its own cost),
        # adds it, then sends its cost: 2(n-1)·S through one link, one message per leaf.
        leaf = _cost(algorithm, nbytes, n, 1, itemsize)
        return Path(c0.messages + leaf.messages, 2 * c0.bytes_sent, c0.bytes_sent,
                    most.bytes_sent, most.messages, f"n = {n} messages through the root",
                    "2(n−1)·S through the root")  # fmt: skip
    if algorithm == "alltoall":
        # All n-1 sends posted at once; every arriving array is added.
        return Path(c0.messages, c0.bytes_sent, c0.bytes_sent, most.bytes_sent, most.messages,
                    f"n−1 = {c0.messages} messages", "(n−1)·S")  # fmt: skip
    raise ValueError(f"no cost path for allreduce algorithm {algorithm!r}")
