"""``--algorithm auto``: the algorithm for each message size, from a table chosen before the run.

The table maps sizes to registered algorithms, ``"65536:tree,*:shm"``: a message of at
most 65,536 bytes goes to ``tree``, any larger one to ``shm``. The launcher writes it
(``--allreduce-table``) from the calibrated cost model before any worker starts
(:func:`disttrain.costing.allreduce_table`): a worker only looks the size up, it never
imports the cost model. A table given by hand fixes the choice. Without one (workers
started by ``torchrun`` or another engine, with no launcher of ours to choose), every
size goes to ``native``, the backend's own allreduce, and rank 0 says so once.

Each rank looks up the same size, so all ranks of a call run the same algorithm. The
halves (reduce-scatter, all-gather) go by the size too, through the chosen algorithm's.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed import ProcessGroup

from disttrain.collectives.base import (
    ALGORITHMS,
    AlgorithmKind,
    AllReduceAlgorithm,
    Cost,
    CostTerms,
    Op,
    get,
    register,
)
from disttrain.collectives.base import start as start_on
from disttrain.collectives.costs import Path
from disttrain.comm.errors import UsageError
from disttrain.config import opt, register_section

__all__ = ["Auto", "AutoConfig", "parse_table"]

#: what every size runs when no launcher chose (the backend's own allreduce)
FALLBACK = "native"


def parse_table(text: str) -> list[tuple[float, str]]:
    """``"65536:tree,*:shm"`` -> [(65536, "tree"), (inf, "shm")]; UsageError naming the
    entry that is wrong. Limits increase; the last entry is ``*``; names are registered
    algorithms that are not themselves choosers."""
    rows: list[tuple[float, str]] = []
    for item in text.split(","):
        limit, sep, name = item.strip().partition(":")
        if not sep or not name:
            raise UsageError(f"--allreduce-table {text!r}: write SIZE:ALGORITHM,...,*:ALGORITHM")
        if name not in ALGORITHMS or name == Auto.name:
            raise UsageError(f"--allreduce-table {text!r}: {name!r} is not an algorithm to run")
        try:
            bound = float("inf") if limit == "*" else int(limit)
        except ValueError:
            raise UsageError(f"--allreduce-table {text!r}: {limit!r} is not a byte count") from None
        if rows and bound <= rows[-1][0]:
            raise UsageError(f"--allreduce-table {text!r}: sizes must increase")
        rows.append((bound, name))
    if rows[-1][0] != float("inf"):
        raise UsageError(f"--allreduce-table {text!r}: end with *:ALGORITHM (any larger size)")
    return rows


@register_section
@dataclass(frozen=True)
class AutoConfig:
    """``--algorithm auto``'s own setting: the table (written by the launcher)."""

    allreduce_table: str = opt(
        "",
        "--algorithm auto: the algorithm per message size, SIZE:NAME,...,*:NAME (the launcher "
        "writes it from the cost model; given, it fixes the choice)",
    )

    def validate(self) -> None:
        if self.allreduce_table:
            parse_table(self.allreduce_table)


class Auto(AllReduceAlgorithm):
    """Each call run by the table's algorithm for its size (bytes)."""

    name = "auto"

    def __init__(self, settings: AutoConfig | None = None) -> None:
        table = settings.allreduce_table if settings else ""
        self.given = bool(table)
        self.table = parse_table(table) if table else [(float("inf"), FALLBACK)]
        self._picked: dict[int, AllReduceAlgorithm] = {}  # bytes -> its runtime, looked up once

    @property
    def chosen(self) -> dict[int, str]:
        """Bytes -> the algorithm that ran a call of that size so far (summary.json)."""
        return {nbytes: algo.name for nbytes, algo in self._picked.items()}

    def name_for(self, nbytes: int) -> str:
        """The table's algorithm for a message of ``nbytes``."""
        return next(name for bound, name in self.table if nbytes <= bound)

    def pick(self, nbytes: int) -> AllReduceAlgorithm:
        """The algorithm that runs a call of ``nbytes``, noted for the summary."""
        algo = self._picked.get(nbytes)
        if algo is None:
            if not self._picked and not self.given and _is_rank_zero():
                sys.stderr.write(
                    "disttrain: --algorithm auto: no table from the launcher (torchrun or an "
                    f"engine started this worker): {FALLBACK} for every size (`disttrain train` "
                    "chooses by the cost model; --allreduce-table fixes a table)\n"
                )
            algo = self._picked[nbytes] = get(self.name_for(nbytes))
        return algo

    def all_reduce(
        self, tensor: torch.Tensor, group: ProcessGroup | None = None, checked: bool = True
    ) -> torch.Tensor:
        """The chosen algorithm's whole call (its own length check and fast paths): a call
        by auto costs one lookup more than the same call by name (RESULTS A8)."""
        return self.pick(tensor.numel() * tensor.element_size()).all_reduce(tensor, group, checked)

    def choices(self) -> list[str]:
        return [name for _, name in self.table]

    def start(self, op: Op, flat: torch.Tensor, group: ProcessGroup | None) -> Any:
        """The chosen algorithm's own start where it has one (native: gloo's or NCCL's
        threads run it), else None: the caller runs the call on its communication thread."""
        return start_on(self.pick(flat.numel() * flat.element_size()), op, flat, group)

    def reduce_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        self.pick(flat.numel() * flat.element_size()).reduce_flat(flat, group)

    def reduce_scatter_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        self.pick(flat.numel() * flat.element_size()).reduce_scatter_flat(flat, group)

    def all_gather_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        self.pick(flat.numel() * flat.element_size()).all_gather_flat(flat, group)

    def cost(
        self, nbytes: int, world_size: int, rank: int = 0, itemsize: int = 1, op: Op = "all_reduce"
    ) -> Cost:
        return get(self.name_for(nbytes)).cost(nbytes, world_size, rank, itemsize, op)


def _is_rank_zero() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def _chain(algo: Auto, nbytes: int, n: int, itemsize: int) -> Path:
    """The chosen algorithm's own critical path for this size."""
    chosen = get(algo.name_for(nbytes))
    return ALGORITHMS.get(chosen.name).cost_terms.chain(chosen, nbytes, n, itemsize)


def _steps(algo: Auto, n: int) -> str:
    del n
    return "by size: " + ", ".join(name for _, name in algo.table)


register(AlgorithmKind(Auto, CostTerms(_chain, _steps), section=AutoConfig, composite=True))
