"""Layer placement: split a sequence of layers into P consecutive stages of balanced cost.

A stage is ``model[a:b]``: ``nn.Sequential`` slicing keeps the children's
names, so a stage's ``state_dict`` keys are the whole model's (``"3.weight"``)
and gathering the stages back into the whole model is a key-by-key copy.

Balance (``--balance``): ``params`` (default) minimises the largest stage's
parameter count; ``time`` minimises the largest stage's measured forward +
backward time; ``2,3,3`` gives the layer count of each stage. The minimax
split of a sequence is the "linear partition" problem, solved exactly by the
O(P·N²) dynamic programme below (N, P are tens at most here).

A stage of parameter-free layers alone (a Flatten, a ReLU) has nothing to
train, and its rank's optimizer would have no parameters: the automatic
balances cut only before a layer that owns parameters (a parameter-free layer
rides with the owner before it, leading ones with the first), and
:func:`idle_ranks` finds the ranks an explicit list leaves without any.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Sequence

import torch
from torch import nn

from disttrain.comm.errors import UsageError

__all__ = [
    "Balance",
    "check_every_rank_trains",
    "check_sequential",
    "idle_ranks",
    "owns_parameters",
    "param_costs",
    "param_sizes",
    "parse_balance",
    "partition",
    "partition_layers",
    "split",
    "stage_bounds",
    "time_costs",
]

Balance = str | list[int]  # "params", "time", or layers per stage


def parse_balance(text: str) -> Balance:
    """``params``, ``time`` or a list of positive layer counts, comma-separated (``2,3,3``;
    ``2/3/3`` in a compare/advise spec, whose settings are comma-separated already)."""
    text = text.strip()
    if text in ("params", "time"):
        return text
    try:
        sizes = [int(part) for part in text.replace("/", ",").split(",")]
    except ValueError:
        raise UsageError(
            f"--balance {text!r}: use params, time, or layers per stage such as 2,3,3"
        ) from None
    if any(n <= 0 for n in sizes):
        raise UsageError(f"--balance {text!r}: every stage needs at least one layer")
    return sizes


def check_sequential(model: nn.Module, strategy: str) -> list[nn.Module]:
    """The model's layers, or :class:`UsageError` if it is not an ``nn.Sequential``."""
    if not isinstance(model, nn.Sequential):
        raise UsageError(
            f"--strategy {strategy} needs a model that is an nn.Sequential of layers, "
            f"got {type(model).__name__}: use --model mlp, cnn or gpt, or return nn.Sequential"
        )
    return list(model)


def param_costs(layers: Sequence[nn.Module]) -> list[float]:
    """Parameters per layer (a parameter-free layer still costs 1, so it is not free to move)."""
    return [float(sum(p.numel() for p in layer.parameters()) or 1) for layer in layers]


def time_costs(layers: Sequence[nn.Module], sample: torch.Tensor, repeats: int = 3) -> list[float]:
    """Median seconds of each layer's forward + backward on ``sample``, layer after layer."""
    costs: list[list[float]] = [[] for _ in layers]
    for _ in range(repeats):
        x = sample
        for i, layer in enumerate(layers):
            inp = x.detach().requires_grad_(x.is_floating_point())
            t0 = time.perf_counter()
            out = layer(inp)
            if out.requires_grad:
                out.backward(torch.ones_like(out))
            costs[i].append(time.perf_counter() - t0)
            x = out.detach()
    for layer in layers:
        layer.zero_grad(set_to_none=True)
    return [statistics.median(c) for c in costs]


def partition(costs: Sequence[float], stages: int) -> list[int]:
    """Layers per stage (consecutive, at least one each) minimising the largest stage cost."""
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot split {n} layers into {stages} stages")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[p][i]: smallest max-stage cost of the first i layers in p stages; cut[p][i]: last cut
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for p in range(1, stages + 1):
        for i in range(p, n + 1):
            for j in range(p - 1, i):
                value = max(best[p - 1][j], prefix[i] - prefix[j])
                if value < best[p][i]:
                    best[p][i], cut[p][i] = value, j
    sizes, i = [], n
    for p in range(stages, 0, -1):
        j = cut[p][i]
        sizes.append(i - j)
        i = j
    return sizes[::-1]


def owns_parameters(layers: Sequence[nn.Module]) -> list[bool]:
    """Whether each layer has parameters of its own (or in its children)."""
    return [any(True for _ in layer.parameters()) for layer in layers]


def partition_layers(costs: Sequence[float], owns: Sequence[bool], stages: int) -> list[int]:
    """:func:`partition` cutting only before a parameter-owning layer (not the first one),
    so that every stage trains something; the plain layer partition where the model has
    fewer such layers than ``stages``."""
    starts = [i for i, own in enumerate(owns) if own][1:]  # every owner after the first
    if len(starts) + 1 < stages:
        return partition(costs, stages)
    bounds = [0, *starts, len(costs)]
    groups = list(itertools.pairwise(bounds))
    sizes, g = [], 0
    for n in partition([sum(costs[a:b]) for a, b in groups], stages):
        sizes.append(groups[g + n - 1][1] - groups[g][0])
        g += n
    return sizes


def idle_ranks(owns: Sequence[bool], sizes: Sequence[int], ranks: int) -> list[int]:
    """The ranks whose stages (r, r + ranks, ...) hold no layer with parameters."""
    trains = [any(owns[a:b]) for a, b in stage_bounds(sizes)]
    return [r for r in range(ranks) if not any(trains[r::ranks])]


def stage_bounds(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` of each stage from its layer count."""
    out, start = [], 0
    for n in sizes:
        out.append((start, start + n))
        start += n
    return out


def split(model: nn.Sequential, sizes: Sequence[int]) -> list[nn.Sequential]:
    """The stages ``model[a:b]``, sharing the model's layers (and their names)."""
    if sum(sizes) != len(model):
        raise UsageError(
            f"--balance {','.join(map(str, sizes))} places {sum(sizes)} layers, "
            f"but the model has {len(model)}: make the counts add up to {len(model)}"
        )
    return [model[a:b] for a, b in stage_bounds(sizes)]  # type: ignore[misc]


def param_sizes(layers: Sequence[nn.Module], cuts: int) -> list[int]:
    """``--balance params``: layers per stage, cut only before a layer with parameters."""
    return partition_layers(param_costs(layers), owns_parameters(layers), cuts)


def check_every_rank_trains(
    layers: Sequence[nn.Module], ranks: int, chunks: int, spec: Balance, text: str
) -> None:
    """UsageError if a rank's stages (``chunks`` each) would hold no parameters: its
    optimizer would have nothing to step. ``spec``: the parsed ``--balance text``."""
    owns = owns_parameters(layers)
    if sum(owns) < ranks:
        raise UsageError(
            f"the model has {sum(owns)} layers with parameters for {ranks} pipeline ranks: "
            f"use at most {sum(owns)} stages"
        )
    chosen = param_sizes(layers, ranks * chunks)
    if idle_ranks(owns, chosen, ranks):  # more stages than such layers: only fewer chunks help
        raise UsageError(
            f"{ranks} ranks x {chunks} virtual stages leave a rank only layers without "
            f"parameters (the model has {sum(owns)} with parameters): use at most "
            f"{sum(owns) // ranks} virtual stages"
        )
    idle = idle_ranks(owns, spec if isinstance(spec, list) else chosen, ranks)
    if idle:
        raise UsageError(
            f"--balance {text} leaves rank {idle[0]} only layers without parameters: every "
            f"rank needs one that trains; try --balance {','.join(map(str, chosen))} "
            f"(what params chooses)"
        )
