"""The allreduce interface, the descriptor each algorithm registers, and the registry by name.

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
``all_gather_flat`` and answering ``cost(..., op=...)`` for them; one that does not
gets the generic fallback through its own allreduce (right, but it sends a whole
allreduce for each half, which is what its ``cost`` states when it ignores ``op``).

The runtime class holds the collective calls and ``cost()`` only. What else is known
about an algorithm (the lab's facts, its cost-model terms, its settings section) is
its :class:`AlgorithmKind`, registered in its own file with :func:`register`.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar, Literal, Protocol, TypeAlias, runtime_checkable

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain.collectives import checks
from disttrain.collectives.chunks import chunk_bounds
from disttrain.collectives.costs import Cost, CostTerms, Path
from disttrain.registry import Registry

__all__ = [
    "ALGORITHMS",
    "OPS",
    "Algorithm",
    "AlgorithmKind",
    "AllReduceAlgorithm",
    "Chooses",
    "Cost",
    "CostTerms",
    "Op",
    "Path",
    "Starts",
    "all_gather",
    "all_reduce",
    "always_starts",
    "build",
    "get",
    "length_check_enabled",
    "reduce_scatter",
    "register",
    "resolve",
    "set_length_check",
    "start",
]

#: The collectives an algorithm runs: its allreduce and the allreduce's two halves.
Op = Literal["all_reduce", "reduce_scatter", "all_gather"]
OPS: tuple[Op, ...] = ("all_reduce", "reduce_scatter", "all_gather")

#: The cross-rank length check (process-wide; see :func:`set_length_check`).
_length_check = True


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


def _checked(name: str, flat: torch.Tensor, group: ProcessGroup | None, checked: bool) -> None:
    """The length check of one call named ``name`` (``allreduce/ring/torch.float32``)."""
    if _length_check and checked:
        checks.check_call(f"{name}/{flat.dtype}", flat.numel(), group)


def _half(
    algo: AllReduceAlgorithm, op: str, flat: torch.Tensor, group: ProcessGroup | None, checked: bool
) -> tuple[int, int]:
    """The shared template of both halves: shape, trivial cases, the length check."""
    if flat.dim() != 1 or not flat.is_contiguous():
        raise ValueError(f"{op} takes a 1-D contiguous tensor, got shape {tuple(flat.shape)}")
    n, r = dist.get_world_size(group), dist.get_rank(group)
    if n > 1:
        _checked(f"{op}/{algo.name}", flat, group, checked)
    return n, r


class AllReduceAlgorithm(ABC):
    """An in-place elementwise sum over a process group, its halves, and what a rank sends.

    A new algorithm is one file in this package (found by itself) or in a plug-in
    module (``$DISTTRAIN_PLUGINS``): a subclass that sets ``name`` and defines
    :meth:`reduce_flat` and :meth:`cost`, registered with its :class:`AlgorithmKind`
    (``register(AlgorithmKind(MyAlgorithm))``), which says the rest.
    """

    name: ClassVar[str]

    def all_reduce(
        self, tensor: torch.Tensor, group: ProcessGroup | None = None, checked: bool = True
    ) -> torch.Tensor:
        """Sum ``tensor`` over ``group`` in place and return it.

        ``checked=False``: no length check for this call (a caller that checked its fixed
        lengths once, as ZeRO's layout does, and calls in a fixed order)."""
        n = dist.get_world_size(group)
        if n == 1:
            return tensor
        _checked(f"allreduce/{self.name}", tensor, group, checked)
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
    def cost(
        self,
        nbytes: int,
        world_size: int,
        rank: int = 0,
        itemsize: int = 1,
        op: Op = "all_reduce",
    ) -> Cost:
        """Bytes and messages group rank ``rank`` sends for ``op`` of ``nbytes`` on
        ``world_size`` ranks.

        ``itemsize`` is the element size: algorithms split the tensor between
        elements, so chunk sizes (and hence the exact bytes) depend on it. The
        cost excludes the optional length check (:func:`checks.check_cost_bytes`).
        ``op``: the allreduce or one of its halves; an algorithm without halves of its
        own ignores it (its halves are whole allreduces: the fallback).
        """

    def reduce_scatter(
        self, flat: torch.Tensor, group: ProcessGroup | None = None, checked: bool = True
    ) -> torch.Tensor:
        """Sum ``flat`` over ``group`` into this rank's chunk; return that chunk (a view).

        Rank r's chunk is ``chunk_bounds(len, n)[r]``. The rest of ``flat`` is
        scratch afterwards (it may hold partial sums); every rank passes the same length.
        ``checked``: as for :meth:`all_reduce`.
        """
        n, r = _half(self, "reduce_scatter", flat, group, checked)
        a, b = chunk_bounds(flat.numel(), n)[r]
        if n > 1 and flat.numel() > 0:
            self.reduce_scatter_flat(flat, group)
        return flat[a:b]

    def all_gather(
        self, flat: torch.Tensor, group: ProcessGroup | None = None, checked: bool = True
    ) -> torch.Tensor:
        """Fill ``flat`` in place with every rank's chunk (rank r gives chunk r); return it.
        ``checked``: as for :meth:`all_reduce`."""
        n, _ = _half(self, "all_gather", flat, group, checked)
        if n > 1 and flat.numel() > 0:
            self.all_gather_flat(flat, group)
        return flat

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


# --- capabilities: what some algorithms do besides the interface (native today). A caller
# asks ``isinstance(algo, Starts)``; an algorithm has one by defining its method.


@runtime_checkable
class Starts(Protocol):
    """Starts a collective without blocking: the backend's own threads run it (native)."""

    def start(self, op: Op, flat: torch.Tensor, group: ProcessGroup | None) -> Any:
        """Start ``op`` of the non-empty 1-D ``flat`` (unchecked) and return its
        ``dist.Work`` (or Future) to ``wait()`` on; None where there is nothing to send."""


@runtime_checkable
class Chooses(Protocol):
    """Runs each call by another registered algorithm, chosen by its size (``auto``)."""

    @property
    def chosen(self) -> dict[int, str]:
        """Bytes -> the algorithm that ran a call of that size, so far (summary.json)."""

    def choices(self) -> list[str]:
        """Every algorithm it may run a call by."""


def start(
    algorithm: AllReduceAlgorithm, op: Op, flat: torch.Tensor, group: ProcessGroup | None
) -> Any:
    """``algorithm.start(op, flat, group)`` where it :class:`Starts`; None otherwise (our
    algorithms are blocking loops, which a caller runs on a
    :class:`~disttrain.comm.commthread.CommThread` instead)."""
    return algorithm.start(op, flat, group) if isinstance(algorithm, Starts) else None


def chooses(name: str) -> bool:
    """Whether the algorithm registered as ``name`` runs each call by another it
    :class:`Chooses` by size (``auto``): a launcher then hands it its table."""
    return isinstance(get(name), Chooses)


def runs(name: str, config: Any) -> list[str]:
    """The algorithms calls go by when a run (``config``, a ``RunConfig``) names ``name``:
    itself, or, a chooser, each it may choose as configured (``auto``: its table's)."""
    algorithm = build(name, config)
    return algorithm.choices() if isinstance(algorithm, Chooses) else [name]


def by_size(algorithm: AllReduceAlgorithm) -> dict[str, Any]:
    """``{"allreduce_by_size": {bytes: name}}``: what a chooser ran each call size by so far
    (a strategy's summary); empty for an algorithm that runs every call itself."""
    if isinstance(algorithm, Chooses):
        return {"allreduce_by_size": dict(sorted(algorithm.chosen.items()))}
    return {}


def always_starts(algorithm: AllReduceAlgorithm) -> bool:
    """Whether every call of ``algorithm`` :class:`Starts` (a caller then needs no
    communication thread): it starts its own, or, a chooser, each algorithm it may choose
    does (``auto`` with the table ``*:native``)."""
    if isinstance(algorithm, Chooses):
        return all(always_starts(get(name)) for name in algorithm.choices())
    return isinstance(algorithm, Starts)


@dataclass(frozen=True)
class AlgorithmKind:
    """One allreduce algorithm as registered: its runtime class, its settings section, its
    cost-model terms, and the facts the lab and pre-flight read.

    ``register(AlgorithmKind(Ring, CostTerms(_chain, _steps), table_position=4, ...))``.
    """

    #: The runtime: built with no argument, or with its settings section when it has one.
    runtime: type[AllReduceAlgorithm]
    #: The cost model's terms (critical path, step formula); read by the lab only.
    cost_terms: CostTerms = field(default_factory=CostTerms)
    #: Its own settings section (a ``@register_section`` dataclass), read by a run exactly
    #: when a strategy that reads ``--algorithm`` runs this algorithm.
    section: type[Any] | None = None
    #: Position in the seed lectures' table of ``compare --algorithms-table`` (1 = first
    #: row); 0: not in it.
    table_position: int = 0
    #: Measured by ``advise --calibrate`` by default: algorithms whose paths differ enough
    #: (steps vs bytes) for the least-squares fit to tell α, δ and β apart.
    calibrates: bool = False
    #: The meter's counts are the documented cost, not observed sends (the backend's own
    #: allreduce): benchmarks report them as estimated, tables leave them out.
    estimated: bool = False
    #: Its ranks must share one host (shared memory): the cost model offers it only for
    #: ranks on one host, ``hierarchical`` uses it inside each host.
    one_host: bool = False
    #: Built of other algorithms (inside and between hosts): not an inter-host choice.
    composite: bool = False
    #: Has its own reduce-scatter and all-gather (not the fallback through its allreduce).
    shards: bool = False
    #: Its path follows the hosts (inside each, then across): what ``--algorithm auto``
    #: runs for several hosts of several ranks each, which the flat cost model cannot price.
    follows_hosts: bool = False

    @property
    def name(self) -> str:
        return self.runtime.name

    @property
    def reads_settings(self) -> tuple[str, ...]:
        """The names of the settings it reads (its section's fields)."""
        if self.section is None:
            return ()
        return tuple(f.name for f in dataclasses.fields(self.section))

    def settings(self, values: Mapping[str, Any]) -> Any:
        """Its section from ``values`` (its settings by name; the rest: their defaults),
        validated; None when it has none."""
        if self.section is None:
            return None
        own = {k: v for k, v in values.items() if k in self.reads_settings}
        section = self.section(**own)
        section.validate()
        return section

    def build(self, values: Mapping[str, Any] | None = None) -> AllReduceAlgorithm:
        """Its runtime, configured by ``values`` (see :meth:`settings`)."""
        if self.section is None:
            return self.runtime()
        runtime: Callable[..., AllReduceAlgorithm] = self.runtime  # takes its section
        return runtime(self.settings(values or {}))

    @cached_property
    def default(self) -> AllReduceAlgorithm:
        """Its runtime with default settings (what :func:`get` returns)."""
        return self.build()


#: The registered algorithms by name, in registration order (filled on import).
ALGORITHMS: Registry[AlgorithmKind] = Registry("allreduce algorithm", flag="--algorithm")


def register(kind: AlgorithmKind) -> AlgorithmKind:
    """Make an algorithm available by its runtime's ``name``; return its kind."""
    ALGORITHMS.add(kind.name, kind)
    for op in ("allreduce", "reduce_scatter", "all_gather"):  # so a mismatch can name it
        checks.add_operation(f"{op}/{kind.name}")
    return kind


def get(name: str) -> AllReduceAlgorithm:
    """The algorithm registered as ``name``, with default settings; unknown: the usage error
    listing the choices."""
    return ALGORITHMS.get(name).default


def build(name: str, config: Any) -> AllReduceAlgorithm:
    """The algorithm ``name`` configured by a run's ``config`` (a ``RunConfig``: its
    section's settings)."""
    kind = ALGORITHMS.get(name)
    return kind.build({s: config.get(s) for s in kind.reads_settings})


#: An algorithm by name (its default settings) or a configured one (:func:`build`).
Algorithm: TypeAlias = str | AllReduceAlgorithm


def resolve(algorithm: Algorithm) -> AllReduceAlgorithm:
    """The runtime ``algorithm`` names, or ``algorithm`` itself when already built."""
    return get(algorithm) if isinstance(algorithm, str) else algorithm


def all_reduce(
    tensor: torch.Tensor, algorithm: Algorithm = "native", group: ProcessGroup | None = None
) -> torch.Tensor:
    """Sum ``tensor`` in place over ``group`` with the named algorithm, and return it."""
    return resolve(algorithm).all_reduce(tensor, group)


def reduce_scatter(
    flat: torch.Tensor, algorithm: Algorithm = "native", group: ProcessGroup | None = None
) -> torch.Tensor:
    """Sum the 1-D ``flat`` into this rank's chunk with the named algorithm; return the chunk."""
    return resolve(algorithm).reduce_scatter(flat, group)


def all_gather(
    flat: torch.Tensor, algorithm: Algorithm = "native", group: ProcessGroup | None = None
) -> torch.Tensor:
    """Fill the 1-D ``flat`` with every rank's chunk with the named algorithm; return it."""
    return resolve(algorithm).all_gather(flat, group)
