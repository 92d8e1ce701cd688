"""The allreduce interface, its cost statement, and the registry of algorithms by name.

Every algorithm is an in-place elementwise sum over a process group. The shared
work lives here (a template method): flatten the tensor, skip the trivial cases
(one rank, zero elements), check that all ranks pass the same length, then hand a
flat contiguous view to the algorithm's :meth:`AllReduceAlgorithm.reduce_flat`.

The two halves of an allreduce are collectives of their own here too, for
sharded data parallelism (ZeRO): :meth:`AllReduceAlgorithm.reduce_scatter` (rank r
ends with the sum of its chunk r) and :meth:`AllReduceAlgorithm.all_gather` (every
rank ends with every rank's chunk). Chunks are the balanced split of
:mod:`chunks` (sizes differ by at most one element: no padding on the wire). An
algorithm file provides them by overriding ``reduce_scatter_flat`` /
``all_gather_flat`` and their costs; one that does not gets the generic fallback
through its own allreduce (right, but it sends a whole allreduce for each half).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain.collectives import checks
from disttrain.collectives.chunks import chunk_bounds
from disttrain.collectives.costs import NOTHING, Cost, Path, max_rank_cost
from disttrain.comm.errors import UsageError
from disttrain.registry import Registry

__all__ = [
    "ALGORITHMS",
    "AllReduceAlgorithm",
    "Cost",
    "Path",
    "all_gather",
    "all_reduce",
    "get",
    "inter_algorithm",
    "length_check_enabled",
    "reduce_scatter",
    "register",
    "set_inter_algorithm",
    "set_length_check",
]

#: The cross-rank length check (process-wide; see :func:`set_length_check`).
_length_check = True
#: The network algorithm composite algorithms use between hosts (``--inter-algorithm``).
_inter = "ring"


def set_length_check(enabled: bool) -> bool:
    """Turn the cross-rank length check on or off for every algorithm; return the old value.

    On by default: gloo silently accepts a *shorter* message than the receive
    buffer and aborts the whole process (SIGABRT) on a *longer* one, so a
    length mismatch would otherwise corrupt data or crash. The check costs one
    32-byte native allreduce per call (see docs/collectives.md for its time); it
    also checks that every rank calls the same algorithm on the same dtype.
    """
    global _length_check
    old, _length_check = _length_check, enabled
    return old


def length_check_enabled() -> bool:
    return _length_check


def set_inter_algorithm(name: str) -> str:
    """Set the algorithm that composite algorithms (``hierarchical``) run between hosts
    (``--inter-algorithm``, process-wide); return the old one. It must cross a network:
    a registered algorithm that is neither ``one_host`` nor composite (UsageError)."""
    global _inter
    algo = get(name)
    if algo.one_host or algo.composite:
        raise UsageError(f"--inter-algorithm {name}: choose an algorithm that crosses hosts")
    old, _inter = _inter, name
    return old


def inter_algorithm() -> str:
    return _inter


class AllReduceAlgorithm(ABC):
    """An in-place elementwise sum over a process group, and everything known about it.

    A new algorithm is one file in this package (found by itself) or in a plug-in
    module (``$DISTTRAIN_PLUGINS``) with a subclass decorated with :func:`register`
    that sets ``name`` and defines :meth:`reduce_flat` and :meth:`cost`; the lab's
    cost model, its tables and benchmarks read the rest from the class.
    """

    name: ClassVar[str]
    #: Position in the seed lectures' table of ``compare --algorithms-table``
    #: (1 = first row); 0: not in it.
    table_position: ClassVar[int] = 0
    #: Measured by ``advise --calibrate`` by default: algorithms whose paths differ
    #: enough (steps vs bytes) for the least-squares fit to tell α, δ and β apart.
    calibrates: ClassVar[bool] = False
    #: The meter's counts are the documented cost, not observed sends (the backend's
    #: own allreduce): benchmarks report them as estimated, tables leave them out.
    estimated: ClassVar[bool] = False
    #: Its ranks must share one host (shared memory): the cost model offers it only for
    #: ranks on one host, ``hierarchical`` uses it inside each host.
    one_host: ClassVar[bool] = False
    #: Built of other algorithms (inside and between hosts): not an inter-host choice.
    composite: ClassVar[bool] = False
    #: Settings this algorithm reads (``inter_algorithm``): read by a run exactly when a
    #: strategy that reads ``algorithm`` runs this one, refused otherwise.
    reads_settings: ClassVar[tuple[str, ...]] = ()

    def all_reduce(
        self, tensor: torch.Tensor, group: ProcessGroup | None = None, checked: bool = True
    ) -> torch.Tensor:
        """Sum ``tensor`` over ``group`` in place and return it.

        ``checked=False``: no length check for this call (a caller that checked its fixed
        lengths once, as ZeRO's layout does, and calls in a fixed order)."""
        n = dist.get_world_size(group)
        if n == 1:
            return tensor
        if _length_check and checked:
            checks.check_call(f"allreduce/{self.name}/{tensor.dtype}", tensor.numel(), group)
        if tensor.numel() == 0:
            return tensor
        if tensor.is_contiguous():
            self.reduce_flat(tensor.view(-1), group)
        else:  # work on a contiguous copy; the result is copied back in place
            flat = tensor.contiguous().view(-1)
            self.reduce_flat(flat, group)
            tensor.copy_(flat.view_as(tensor))
        return tensor

    @abstractmethod
    def reduce_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        """Sum the non-empty 1-D contiguous ``flat`` over ``group`` (of two or more ranks)."""

    @abstractmethod
    def cost(self, nbytes: int, world_size: int, rank: int = 0, itemsize: int = 1) -> Cost:
        """Bytes and messages group rank ``rank`` sends for ``nbytes`` on ``world_size`` ranks.

        ``itemsize`` is the element size: algorithms split the tensor between
        elements, so chunk sizes (and hence the exact bytes) depend on it. The
        cost excludes the optional length check (:func:`checks.check_cost_bytes`).
        """

    def critical_path(self, nbytes: int, n: int, itemsize: int = 4) -> Path:
        """The critical path of one allreduce of ``nbytes`` on ``n`` ranks (:mod:`costs`)."""
        if n <= 1 or nbytes == 0:
            return NOTHING
        return self.chain(nbytes, n, itemsize)

    def chain(self, nbytes: int, n: int, itemsize: int) -> Path:
        """The critical path when there is something to send (n >= 2, nbytes > 0).

        Default: the busiest rank's sends one after another, every byte of them
        added on arrival (an upper bound: an algorithm that overlaps sends, or
        adds only part of what arrives, overrides this with its own chain).
        """
        most = max_rank_cost(self, nbytes, n, itemsize)
        return Path(
            most.messages,
            most.bytes_sent,
            most.bytes_sent,
            most.bytes_sent,
            most.messages,
            f"{most.messages} messages one after another",
            "the busiest rank's bytes",
        )

    def steps_formula(self, n: int) -> str:
        """Dependent communication rounds on ``n`` ranks, by the algorithm's formula.

        For ``compare --algorithms-table``; "-" where no closed form is stated.
        """
        return "-"

    # --- the two halves: reduce-scatter and all-gather (sharded data parallelism) ------
    #: True if the algorithm has its own reduce-scatter and all-gather; False: the
    #: generic fallback through :meth:`reduce_flat` (a whole allreduce for each half).
    shards: ClassVar[bool] = False

    def _half(
        self, op: str, flat: torch.Tensor, group: ProcessGroup | None, checked: bool
    ) -> tuple[int, int]:
        """The shared template of both halves: shape, trivial cases, the length check."""
        if flat.dim() != 1 or not flat.is_contiguous():
            raise ValueError(f"{op} takes a 1-D contiguous tensor, got shape {tuple(flat.shape)}")
        n, r = dist.get_world_size(group), dist.get_rank(group)
        if n > 1 and _length_check and checked:
            checks.check_call(f"{op}/{self.name}/{flat.dtype}", flat.numel(), group)
        return n, r

    def reduce_scatter(
        self, flat: torch.Tensor, group: ProcessGroup | None = None, checked: bool = True
    ) -> torch.Tensor:
        """Sum ``flat`` over ``group`` into this rank's chunk; return that chunk (a view).

        Rank r's chunk is ``chunk_bounds(len, n)[r]``. The rest of ``flat`` is
        scratch afterwards (it may hold partial sums); every rank passes the same length.
        ``checked``: as for :meth:`all_reduce`.
        """
        n, r = self._half("reduce_scatter", flat, group, checked)
        a, b = chunk_bounds(flat.numel(), n)[r]
        if n > 1 and flat.numel() > 0:
            self.reduce_scatter_flat(flat, group)
        return flat[a:b]

    def all_gather(
        self, flat: torch.Tensor, group: ProcessGroup | None = None, checked: bool = True
    ) -> torch.Tensor:
        """Fill ``flat`` in place with every rank's chunk (rank r gives chunk r); return it.
        ``checked``: as for :meth:`all_reduce`."""
        n, _ = self._half("all_gather", flat, group, checked)
        if n > 1 and flat.numel() > 0:
            self.all_gather_flat(flat, group)
        return flat

    # --- started without blocking (unchecked), where the backend can ---------------------
    def start_all_reduce(self, flat: torch.Tensor, group: ProcessGroup | None) -> Any:
        """Start :meth:`all_reduce` of the non-empty 1-D ``flat`` (unchecked) and return its
        ``dist.Work`` to ``wait()`` on; None where the algorithm has no asynchronous form
        (the default: our algorithms are blocking loops, which a caller runs on a
        :class:`~disttrain.comm.commthread.CommThread` instead)."""
        return None

    def start_reduce_scatter(self, flat: torch.Tensor, group: ProcessGroup | None) -> Any:
        """:meth:`start_all_reduce` for :meth:`reduce_scatter` (default: None)."""
        return None

    def start_all_gather(self, flat: torch.Tensor, group: ProcessGroup | None) -> Any:
        """:meth:`start_all_reduce` for :meth:`all_gather` (default: None)."""
        return None

    def reduce_scatter_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        """Leave the sum of this rank's chunk in place (non-empty ``flat``, two or more ranks).

        Fallback: the whole allreduce (every chunk summed everywhere).
        """
        self.reduce_flat(flat, group)

    def all_gather_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        """Fill the other ranks' chunks of ``flat`` (non-empty, two or more ranks).

        Fallback: zero the others' chunks and sum: each element then has exactly
        one non-zero term, so the sum is the gathered value (x + 0 is exact).
        """
        n, r = dist.get_world_size(group), dist.get_rank(group)
        a, b = chunk_bounds(flat.numel(), n)[r]
        flat[:a].zero_()
        flat[b:].zero_()
        self.reduce_flat(flat, group)

    def reduce_scatter_cost(
        self, nbytes: int, world_size: int, rank: int = 0, itemsize: int = 1
    ) -> Cost:
        """What :meth:`reduce_scatter` sends (fallback: the allreduce's :meth:`cost`)."""
        return self.cost(nbytes, world_size, rank, itemsize)

    def all_gather_cost(
        self, nbytes: int, world_size: int, rank: int = 0, itemsize: int = 1
    ) -> Cost:
        """What :meth:`all_gather` of ``nbytes`` in all sends (fallback: the allreduce's)."""
        return self.cost(nbytes, world_size, rank, itemsize)


#: The registered algorithms by name, in registration order (filled on import).
ALGORITHMS: Registry[AllReduceAlgorithm] = Registry("allreduce algorithm", flag="--algorithm")


def register(cls: type[AllReduceAlgorithm]) -> type[AllReduceAlgorithm]:
    """Class decorator: make an algorithm available by its ``name``."""
    ALGORITHMS.add(cls.name, cls())
    for op in ("allreduce", "reduce_scatter", "all_gather"):  # so a mismatch can name it
        checks.add_operation(f"{op}/{cls.name}")
    return cls


def get(name: str) -> AllReduceAlgorithm:
    """The algorithm registered as ``name``; unknown: the usage error listing the choices."""
    return ALGORITHMS.get(name)


def all_reduce(
    tensor: torch.Tensor, algorithm: str = "native", group: ProcessGroup | None = None
) -> torch.Tensor:
    """Sum ``tensor`` in place over ``group`` with the named algorithm, and return it."""
    return get(algorithm).all_reduce(tensor, group)


def reduce_scatter(
    flat: torch.Tensor, algorithm: str = "native", group: ProcessGroup | None = None
) -> torch.Tensor:
    """Sum the 1-D ``flat`` into this rank's chunk with the named algorithm; return the chunk."""
    return get(algorithm).reduce_scatter(flat, group)


def all_gather(
    flat: torch.Tensor, algorithm: str = "native", group: ProcessGroup | None = None
) -> torch.Tensor:
    """Fill the 1-D ``flat`` with every rank's chunk with the named algorithm; return it."""
    return get(algorithm).all_gather(flat, group)
