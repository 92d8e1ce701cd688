"""What one allreduce costs: one rank's sends (:class:`Cost`) and the critical path (:class:`Path`).

Each algorithm states what ONE rank sends (:meth:`AllReduceAlgorithm.cost`: bytes and
messages). Time is set by the longest chain of dependent transfers, which is not always
one rank's own sends: a folded butterfly waits for the rank that sits out, a tree node
waits for its children level after level, the star's root first receives everything
and then sends everything. Each algorithm turns its stated costs into that chain (its
:class:`CostTerms`, registered with it), for the cost model (:mod:`disttrain.lab.costmodel`):

    time = steps·α + critical_bytes·β + reduced_bytes·γ

(α: seconds per message, β: seconds per byte on a link, γ: seconds per byte added
in memory), plus copied_bytes·μ for an algorithm that moves data through memory shared
by the ranks of one host (μ: seconds per byte copied by one thread, calibrated).
The byte and message counts always come from ``cost()``; what a chain adds
is only which of them follow one another. Links are full duplex (each rank sends and
receives at the same time, as the emulated cluster's shaping does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "NOTHING",
    "Cost",
    "CostTerms",
    "Costed",
    "Path",
    "max_rank_cost",
    "no_formula",
    "priced_ranks_per_host",
    "pricing_layout",
    "representative_ranks",
    "serial_path",
    "two_phase_path",
]


@dataclass(frozen=True)
class Cost:
    """What one rank is expected to send for one allreduce: bytes and messages.

    ``bytes_copied``: bytes the rank writes into or reads out of memory shared with
    its peers (a shared-memory algorithm), apart from the bytes it sends over a network.
    """

    bytes_sent: int
    messages: int
    bytes_copied: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.bytes_sent + other.bytes_sent,
            self.messages + other.messages,
            self.bytes_copied + other.bytes_copied,
        )


class Costed(Protocol):
    """Anything with an algorithm's ``cost()`` (the helpers here need no more)."""

    def cost(
        self, nbytes: int, world_size: int, rank: int = 0, itemsize: int = 1, op: Any = ...
    ) -> Cost: ...


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
    total_messages: int = 0  # over all ranks (cost() summed; filled by the lab's cache)
    total_bytes: int = 0
    copied_bytes: int = 0  # bytes the busiest rank copies through shared memory: each pays μ
    total_copied: int = 0  # over all ranks (filled by the lab's cache)
    #: of the steps, those taken with every rank already inside this collective (a
    #: shared-memory barrier between two pieces): no one arrives late or is woken from
    #: sleep there, so the cost model prices them apart (Calibration.shared_memory)
    inner_steps: int = 0

    def seconds(self, alpha: float, beta: float, gamma: float, mu: float = 0.0) -> float:
        return (
            self.steps * alpha
            + self.critical_bytes * beta
            + self.reduced_bytes * gamma
            + self.copied_bytes * mu
        )

    def shared_seconds(
        self,
        alpha: float,
        delta: float,
        beta: float,
        mu: float = 0.0,
        inner_alpha: float | None = None,
    ) -> float:
        """Ranks sharing one host's cores: every message and byte of every rank is CPU work.

        steps·α (each step waits for its peers to be scheduled; the inner steps pay
        ``inner_alpha`` where given) + all messages·δ + all bytes·β: on loopback a transfer
        is a copy by the kernel on the same cores; a shared-memory copy is a copy by the
        rank itself (all ranks' copies·μ).
        """
        inner = alpha if inner_alpha is None else inner_alpha
        return (
            (self.steps - self.inner_steps) * alpha
            + self.inner_steps * inner
            + self.total_messages * delta
            + self.total_bytes * beta
            + self.total_copied * mu
        )


#: The path of an allreduce that sends nothing (one rank, or zero bytes).
NOTHING = Path(0, 0, 0, 0, 0, "nothing to send", "nothing to send")


def representative_ranks(n: int) -> list[int]:
    """Ranks whose costs bound every rank's (computing all n is O(n²) at n = 10,000).

    Chunked algorithms give the first ``numel % n`` chunks one element more, so the
    extremes sit at the start and near the end; the fold's pairs sit at the start.
    Beyond 64 ranks only the three that matter most are computed (O(n) each).
    """
    picks = (0, 1, 2, 3, n // 2, n - 3, n - 2, n - 1) if n <= 64 else (0, 1, n - 3)
    return sorted({r for r in picks if 0 <= r < n})


def max_rank_cost(algo: Costed, nbytes: int, n: int, itemsize: int = 4) -> Cost:
    """The most bytes (and messages) any rank sends, over the representative ranks."""
    costs = [algo.cost(nbytes, n, r, itemsize) for r in representative_ranks(n)]
    return Cost(max(c.bytes_sent for c in costs), max(c.messages for c in costs))


def serial_path(algo: Costed, nbytes: int, n: int, itemsize: int) -> Path:
    """The busiest rank's sends one after another, every byte of them added on arrival.

    The default chain: an upper bound (an algorithm that overlaps sends, or adds only
    part of what arrives, states its own chain).
    """
    most = max_rank_cost(algo, nbytes, n, itemsize)
    return Path(
        most.messages,
        most.bytes_sent,
        most.bytes_sent,
        most.bytes_sent,
        most.messages,
        f"{most.messages} messages one after another",
        "the busiest rank's bytes",
    )


def no_formula(algo: Any, n: int) -> str:
    """The step formula of an algorithm that states none."""
    del algo, n
    return "-"


@dataclass(frozen=True)
class CostTerms:
    """What the cost model reads of one algorithm besides its ``cost()`` (registered with
    it in its :class:`~disttrain.collectives.base.AlgorithmKind`; the lab reads it through
    :mod:`disttrain.collectives.paths`).

    ``chain(algo, nbytes, n, itemsize)``: the critical path of one allreduce when there is
    something to send (n >= 2, nbytes > 0), built from ``algo.cost()``; ``algo`` is the
    runtime, configured. ``steps(algo, n)``: dependent communication rounds on ``n`` ranks
    by the algorithm's formula, for ``compare --algorithms-table``; "-" where none is stated.
    """

    chain: Callable[[Any, int, int, int], Path] = serial_path
    steps: Callable[[Any, int], str] = no_formula


def two_phase_path(algo: Costed, nbytes: int, n: int, itemsize: int) -> Path:
    """A reduce-scatter then all-gather in 2(n-1) dependent steps (ring, round-robin, gloo).

    Every step waits for the previous one; half of what arrives (the reduce-scatter)
    is added.
    """
    c0 = algo.cost(nbytes, n, 0, itemsize)
    most = max_rank_cost(algo, nbytes, n, itemsize)
    return Path(
        c0.messages,
        most.bytes_sent,
        most.bytes_sent // 2,
        most.bytes_sent,
        most.messages,
        f"2(n−1) = {c0.messages} steps",
        "2(n−1)/n·S",
    )


#: Ranks per host of the layout a cost model prices (its workload's), set around one
#: prediction by :func:`pricing_layout`; None: a running job prices its own layout
#: (``$LOCAL_WORLD_SIZE``). Without it ``disttrain advise --nodes 64``, run from a shell,
#: priced the hierarchical allreduce as 64 ranks of one host: shared memory, 0 bytes sent.
_RANKS_PER_HOST: ContextVar[int | None] = ContextVar("ranks_per_host", default=None)


@contextmanager
def pricing_layout(ranks_per_host: int) -> Iterator[None]:
    """Within the block, algorithms that depend on the hosts price ``ranks_per_host``."""
    token = _RANKS_PER_HOST.set(max(1, ranks_per_host))
    try:
        yield
    finally:
        _RANKS_PER_HOST.reset(token)


def priced_ranks_per_host() -> int | None:
    """The ranks per host a cost model prices now (None: the job's own layout)."""
    return _RANKS_PER_HOST.get()
