"""The ZeRO machinery one run holds: a shard layout, its reducer and (stage 3) its gatherer.

The zero strategy (:mod:`disttrain.strategies.zero`) and the Python API
(``dt.ShardedOptimizer``, ``dt.shard_model``) both drive a :class:`ZeroEngine`:

    engine = ZeroEngine.build(model or params, stage, algorithm, overlap, group, fusion_bytes)
    engine.point(optimizer)          # the optimizer steps this rank's shards
    each step: engine.begin_step(); forward + backward; engine.synchronize()
               optimizer.step(); engine.finish_step()

Stages 1 and 2 group parameters into fusion buckets (in the order backward makes
their gradients ready), stage 3 into one group per layer. A checkpoint holds this
rank's shards (:meth:`shard_state`); :func:`recut_shard_state` re-cuts the shards
of N ranks for rank r of M (a resume on another worker count, or M = 1: the whole).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup

from disttrain import collectives, timeline
from disttrain.collectives.checks import checks_everywhere
from disttrain.collectives.chunks import chunk_bounds
from disttrain.dataparallel.fusion import assign_by_size
from disttrain.dataparallel.gather import LayerGatherer, layer_groups
from disttrain.dataparallel.gather_units import check_units
from disttrain.dataparallel.sharding import (
    ShardedReducer,
    ShardLayout,
    check_layout,
    shard_optimizer,
)

__all__ = [
    "ZeroEngine",
    "check_shard_state",
    "fusion_groups",
    "group_numels",
    "recut",
    "recut_optimizer_state",
    "recut_shard_state",
]


def fusion_groups(params: Sequence[nn.Parameter], fusion_bytes: int) -> list[list[nn.Parameter]]:
    """Fusion buckets of ``params`` (given in registration order) in backward's order."""
    ordered = list(reversed(params))  # backward makes the last layer's gradients first
    return [[ordered[i] for i in idx] for idx in assign_by_size(ordered, fusion_bytes)]


class ZeroEngine:
    """One layout of ``groups`` over ``group``'s ranks, its reducer and stage 3's gatherer."""

    def __init__(
        self,
        groups: Sequence[Sequence[nn.Parameter]],
        stage: int,
        algorithm: collectives.Algorithm,
        overlap: bool,
        group: ProcessGroup | None,
        model: nn.Module | None = None,
    ) -> None:
        if stage not in (1, 2, 3):
            raise ValueError(f"ZeRO stage must be 1, 2 or 3, got {stage}")
        #: a name (unknown: the registry's usage error) or a configured algorithm
        self.algo = collectives.resolve(algorithm)
        self.stage, self.algorithm, self.group = stage, self.algo.name, group
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        self.layout = ShardLayout(groups, n, rank, own_shards=stage == 3)
        check_layout(self.layout, group)  # once: the steps' calls are not checked each
        self.reducer = ShardedReducer(self.layout, self.algo, overlap, group, keep_full=stage == 1)
        self.gatherer: LayerGatherer | None = None
        if stage == 3:
            assert model is not None, "stage 3 gathers per layer: it needs the model"
            self.gatherer = LayerGatherer(model, self.layout, self.algo, group)

    @classmethod
    def build(
        cls,
        model: nn.Module | None,
        params: Sequence[nn.Parameter],
        stage: int,
        algorithm: collectives.Algorithm,
        overlap: bool,
        group: ProcessGroup | None,
        fusion_bytes: int,
    ) -> ZeroEngine:
        """Stage 3: one group per layer of ``model``; stages 1, 2: ``params`` in fusion buckets."""
        if stage == 3:
            assert model is not None, "stage 3 gathers per layer: it needs the model"
            check_units(model)  # before the layout packs (and would cast) the parameters
            return cls(layer_groups(model), stage, algorithm, overlap, group, model)
        return cls(fusion_groups(params, fusion_bytes), stage, algorithm, overlap, group)

    @property
    def n(self) -> int:
        return self.layout.n

    def params(self) -> list[nn.Parameter]:
        """The model's parameters this engine shards, in group order."""
        return [p for g in self.layout.groups for p in g.params]

    def point(self, optimizer: torch.optim.Optimizer) -> None:
        """Make ``optimizer`` step this rank's shards (its state is cleared)."""
        shard_optimizer(optimizer, self.layout.shards)

    # --- the step -----------------------------------------------------------------------
    def begin_step(self) -> None:
        """Before a forward: drop the parameters' stale gradients (the shards hold the
        reduced ones) and free the layers evaluation held gathered (stage 3)."""
        for p in self.params():
            p.grad = None
        if self.gatherer is not None:
            self.gatherer.release()

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate gradients (no communication)."""
        with self.reducer.no_sync():
            yield

    def synchronize(self) -> None:
        """Every shard's ``.grad`` is its average over the ranks when this returns."""
        self.reducer.synchronize()

    def finish_step(self) -> None:
        """After the optimizer stepped the shards: all-gather each group (stages 1, 2), or
        free every layer (stage 3: the shards are the parameters, gathered when used)."""
        if self.gatherer is not None:
            self.gatherer.release()
            return
        with timeline.span("all-gather parameters"):
            algo, checked = self.algo, checks_everywhere()
            started = []  # native: every group's started at once, then waited for
            for group in self.layout.groups:
                work = (
                    None
                    if checked
                    else collectives.start(algo, "all_gather", group.flat, self.group)
                )
                if work is None:
                    algo.all_gather(group.flat, self.group, checked)
                else:
                    started.append(work)
            for work in started:
                work.wait()

    def full_model(self, model: nn.Module, keep: bool) -> nn.Module | None:
        """The whole ``model`` on the rank that ``keep``s it (collective: every rank calls);
        stage 3 holds every layer gathered until the next :meth:`begin_step` or :meth:`release`."""
        if self.gatherer is not None:
            return self.gatherer.full_model(keep)
        return model if keep else None

    def release(self) -> None:
        if self.gatherer is not None:
            self.gatherer.release()

    def close(self) -> None:
        self.reducer.close()
        if self.gatherer is not None:
            self.gatherer.close()

    @property
    def gathered_peak(self) -> int:
        return self.gatherer.peak_bytes if self.gatherer is not None else 0

    # --- state ----------------------------------------------------------------------------
    def shard_state(self) -> dict[str, Any]:
        """This rank's shards, with what a resume needs to check or re-cut them."""
        return {
            "stage": self.stage,
            "world_size": self.n,
            "group_numels": [g.numel for g in self.layout.groups],
            "shards": [g.shard.detach().clone() for g in self.layout.groups],
        }

    def load_shard_state(self, state: dict[str, Any]) -> None:
        """Copy the shards of :meth:`shard_state` (of this layout) in; ValueError if not it."""
        check_shard_state(state, self.stage, [g.numel for g in self.layout.groups])
        if state["world_size"] != self.n:
            raise ValueError(f"shards of {state['world_size']} ranks, not {self.n}: re-cut them")
        with torch.no_grad():
            for group, saved in zip(self.layout.groups, state["shards"], strict=True):
                group.shard.copy_(saved)


def group_numels(model: nn.Module, stage: int, fusion_bytes: int) -> list[int]:
    """The sizes of the groups :meth:`ZeroEngine.build` makes of ``model`` (nothing is cut)."""
    params = list({id(p): p for p in model.parameters() if p.requires_grad}.values())
    groups = layer_groups(model) if stage == 3 else fusion_groups(params, fusion_bytes)
    return [sum(p.numel() for p in g) for g in groups]


def check_shard_state(state: dict[str, Any], stage: int, numels: Sequence[int]) -> None:
    """ValueError, one line, if ``state`` (a :meth:`ZeroEngine.shard_state`, or a checkpoint
    strategy entry) is not shards of ``stage`` over groups of ``numels`` elements."""
    if "stage" not in state:
        raise ValueError(
            "the checkpoint holds no ZeRO shards (another --strategy wrote it): resume it "
            "with its own --strategy"
        )
    if state["stage"] != stage:
        raise ValueError(
            f"the checkpoint holds ZeRO stage {state['stage']} shards, this run is stage "
            f"{stage}: resume with --zero-stage {state['stage']}"
        )
    if list(state["group_numels"]) != list(numels):
        raise ValueError(
            f"the checkpoint's ZeRO groups ({len(state['group_numels'])} of "
            f"{sum(state['group_numels'])} elements) are not this run's ({len(numels)} of "
            f"{sum(numels)}): resume with the --model and --fusion-mb it was written with"
        )


# --- re-cutting shards ----------------------------------------------------------------------
def recut(chunks: Sequence[torch.Tensor], n: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s chunk among ``n`` of the flat tensor whose old chunks are ``chunks``
    (old rank j's chunk j, the balanced cut of :mod:`~disttrain.collectives.chunks`)."""
    full = torch.cat([c.reshape(-1) for c in chunks])
    start, stop = chunk_bounds(full.numel(), n)[rank]
    return full[start:stop].clone()


def recut_optimizer_state(states: Sequence[dict[str, Any]], n: int, rank: int) -> dict[str, Any]:
    """Rank ``rank``'s optimizer ``state_dict`` among ``n`` from those of the old ranks.

    Each old optimizer stepped one shard per group (param index i = group i): a
    state tensor of one or more dimensions is elementwise (momentum, Adam's moments)
    and is re-cut like the shard; a scalar (Adam's step) is the same on every rank.
    """
    first = states[0]
    new: dict[Any, dict[str, Any]] = {}
    for index, entry in first["state"].items():
        new[index] = {}
        for key, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() >= 1:
                new[index][key] = recut([s["state"][index][key] for s in states], n, rank)
            else:
                new[index][key] = value.clone() if isinstance(value, torch.Tensor) else value
    return {"state": new, "param_groups": first["param_groups"]}


def recut_shard_state(states: Sequence[dict[str, Any]], n: int, rank: int) -> dict[str, Any]:
    """Rank ``rank``'s :meth:`ZeroEngine.shard_state` among ``n`` from the old ranks' states."""
    first = states[0]
    shards = [
        recut([s["shards"][i] for s in states], n, rank) for i in range(len(first["group_numels"]))
    ]
    return {**first, "world_size": n, "shards": shards}
