"""A stream's uneven end, dealt out evenly: every sample trained once, by every strategy.

A stream's ranks may hold different numbers of batches at the end of an epoch (uneven
shards, a worker's last partial batch). Every strategy needs every data shard to step
the same number of times (an allreduce, a pipeline's sends, a parameter server's clock),
so the ranks agree each step whether all of them have a batch (:class:`EvenEnd`, one
``MIN`` allreduce of a flag). At the first step one of them has none, the epoch's *tail*
begins:

1. every rank drains what is left of its share into memory: at most the difference
   between its share and the smallest one (under :class:`~disttrain.data.torchloader.
   RankSplit`'s round-robin split, about one partial batch per loader worker; a stream
   that splits itself decides its own shares, and the drain holds their difference);
2. the ranks exchange their counts and shard ids (an int tensor each: ``all_gather``);
3. the batches' structure travels from the first rank that holds samples, as JSON bytes
   in a ``uint8`` tensor (dtypes, trailing shapes, dict keys), then each leaf's rows as
   tensors (``all_gather``, padded to the largest count): nothing is pickled;
4. the samples, joined in shard order, are re-dealt (:func:`deal`) so that every data
   shard gets the same number K of final batches, each of at most the rank's batch
   size ``b`` and at least one sample.

Why this design and not DDP's Join (ranks out of data shadow the collectives with zero
gradients): Join fits the strategies whose only collective is a gradient allreduce; a
pipeline's activations, ZeRO-3's gathers, the parameter server's clock or DiLoCo's outer
step would each need their own shadow. Dealing the tail keeps the one invariant all of
them already rely on (the same steps on every shard), so no strategy changes.

The final batches are dealt as global batches (``tensor_split`` of the joined rows into
K near-equal parts, each split among the D shards), so within one step the shards'
pieces differ by at most one sample: as with a map-style epoch's last partial global
batch, a sample of a smaller piece weighs a little more in that step's mean.

What cannot be dealt: fewer samples left than shards (some shard would step on an empty
batch), and with ``b = 1`` the last ``S mod D``; at most D - 1 samples an epoch, and one
line says how many. Batches whose leaves differ in trailing shape (a collate that pads
to each batch's longest sequence) or structure across ranks cannot be joined row by
row: their samples are not trained, and the line says why. A leaf that is not a tensor
(strings, an object) is refused at the first step, in one line naming it: its rows
could not travel without pickle.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from disttrain.batch import num_samples
from disttrain.comm.errors import UsageError

__all__ = ["Deal", "EvenEnd", "deal", "join", "not_a_tensor", "pieces_of"]


@dataclass(frozen=True)
class Deal:
    """How ``samples`` joined rows end an epoch on ``len(pieces)`` data shards: shard j's
    final batches are the row ranges ``pieces[j]`` (K of them each), ``used`` rows in all
    (the rest, at most D - 1, cannot be dealt)."""

    samples: int
    used: int
    pieces: list[list[tuple[int, int]]]

    @property
    def steps(self) -> int:
        return len(self.pieces[0]) if self.pieces else 0


def deal(samples: int, shards: int, per_batch: int) -> Deal:
    """The tail of ``samples`` rows on ``shards`` data shards of batches of at most
    ``per_batch``: K = ceil(S / (D b)) steps, fewer when some shard's piece would be
    empty (then K = floor(S / D), which is 0 for S < D)."""
    if shards < 1 or per_batch < 1 or samples < 0:
        raise ValueError(f"deal({samples}, {shards}, {per_batch})")
    steps = -(-samples // (shards * per_batch))
    if steps * shards > samples:  # a piece of every step on every shard needs K D <= S
        steps = samples // shards
    used = min(samples, steps * shards * per_batch)
    pieces: list[list[tuple[int, int]]] = [[] for _ in range(shards)]
    lo = 0
    for t in range(steps):  # global batch t: floor(U/K) >= D rows, ceil(U/K) <= D b
        size = used // steps + (1 if t < used % steps else 0)
        for j in range(shards):
            part = size // shards + (1 if j < size % shards else 0)
            pieces[j].append((lo, lo + part))
            lo += part
    return Deal(samples, used, pieces)


# --- a batch as rows: its structure (JSON-able) and its tensor leaves ---------------------
def not_a_tensor(batch: Any, where: str = "batch") -> str | None:
    """Where ``batch`` holds a leaf that is not a tensor (``batch['text']``), or None."""
    if isinstance(batch, torch.Tensor):
        return None
    if isinstance(batch, dict):
        for k, v in batch.items():
            if not isinstance(k, (str, int)):  # the structure travels as JSON
                return f"{where} (a dict keyed by a {type(k).__name__})"
            found = not_a_tensor(v, f"{where}[{k!r}]")
            if found:
                return found
        return None
    if type(batch) in (list, tuple):
        for i, v in enumerate(batch):
            found = not_a_tensor(v, f"{where}[{i}]")
            if found:
                return found
        return None
    return f"{where} (a {type(batch).__name__})"


def _spec(batch: Any, leaves: list[torch.Tensor]) -> Any:
    if isinstance(batch, torch.Tensor):
        leaves.append(batch)
        return {"t": [str(batch.dtype)[6:], list(batch.shape[1:]), batch.dim()]}
    if isinstance(batch, dict):
        return {"d": [[k, _spec(v, leaves)] for k, v in batch.items()]}
    return {"l" if isinstance(batch, list) else "u": [_spec(v, leaves) for v in batch]}


def _build(spec: Any, leaves: Iterator[torch.Tensor]) -> Any:
    if "t" in spec:
        return next(leaves)
    if "d" in spec:
        return {k: _build(v, leaves) for k, v in spec["d"]}
    items = [_build(v, leaves) for v in spec.get("l", spec.get("u"))]
    return items if "l" in spec else tuple(items)


def join(batches: Sequence[Any]) -> tuple[str, list[torch.Tensor], int] | str:
    """``batches`` (tensor leaves only) as one structure, its leaves joined along the
    first dimension, and the row count; or why they cannot be (a line's reason)."""
    if not batches:
        return "", [], 0
    first: list[torch.Tensor] = []
    spec = json.dumps(_spec(batches[0], first))
    columns: list[list[torch.Tensor]] = [[t] for t in first]
    for batch in batches[1:]:
        leaves: list[torch.Tensor] = []
        if json.dumps(_spec(batch, leaves)) != spec:
            return "its batches differ in structure or trailing shape"
        for column, leaf in zip(columns, leaves, strict=True):
            column.append(leaf)
    if not first or any(t.dim() == 0 for t in first):
        return "a batch leaf has no sample dimension"
    if len({t.shape[0] for t in first}) != 1:
        return "a batch's leaves hold different numbers of samples"
    joined = [torch.cat(c) for c in columns]
    return spec, joined, int(joined[0].shape[0])


def pieces_of(spec: str, leaves: list[torch.Tensor], ranges: list[tuple[int, int]]) -> list[Any]:
    """The batches of rows ``ranges`` of the joined ``leaves``, in ``spec``'s structure."""
    tree = json.loads(spec)
    # copies: a state taken in the tail saves its pieces, not the joined rows under them
    return [_build(tree, iter([t[lo:hi].clone() for t in leaves])) for lo, hi in ranges]


# --- the ranks' agreement and the exchange ----------------------------------------------
class EvenEnd:
    """``loader``'s batches on this rank of ``group`` (its data shard ``shard``) while every
    rank has one, then this shard's part of the dealt tail. ``left`` is what is left of
    the tail after the batch last handed over (a state taken during the tail holds it);
    ``untrained`` the samples that could not be dealt (at most D - 1, or a ragged tail)."""

    def __init__(self, loader: Any, shard: int, group: Any, per_batch: int) -> None:
        self.loader, self.shard, self.group, self.per_batch = loader, shard, group, per_batch
        self.left: deque[Any] | None = None  # None: not in the tail
        self.untrained = 0
        on_gpu = dist.get_backend(group) == "nccl"  # NCCL moves CUDA tensors only
        self.device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else None

    def __iter__(self) -> Iterator[Any]:
        batches = iter(self.loader)
        while True:
            batch = next(batches, None)
            if not self._all_have(batch):
                break
            yield batch
        held = ([] if batch is None else [batch]) + list(batches)  # the drain
        self.left = deque(self._dealt(held))
        while self.left:
            yield self.left.popleft()

    def _all_have(self, batch: Any) -> bool:
        """The step's agreement: 0 no batch, 1 a leaf that is not a tensor, 2 a batch."""
        leaf = None if batch is None else not_a_tensor(batch)
        flag = torch.tensor([0 if batch is None else 1 if leaf else 2], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        if int(flag.item()) == 1:
            raise UsageError(_refusal(leaf))
        return int(flag.item()) == 2

    def _dealt(self, held: list[Any]) -> list[Any]:
        """This shard's final batches of every rank's ``held`` batches, dealt."""
        leaf = next((w for w in map(not_a_tensor, held) if w), None)
        joined = join(held) if leaf is None else leaf
        ragged = isinstance(joined, str)
        n = joined[2] if not isinstance(joined, str) else 0 if leaf else _rows_in(held)
        status = 2 if leaf else 1 if ragged else 0
        heads = self._gather(torch.tensor([self.shard, n, self.per_batch, status]))
        if any(int(h[3]) == 2 for h in heads):
            raise UsageError(_refusal(leaf))
        firsts: dict[int, int] = {}  # a data shard's first rank: its model-parallel peers
        for r, h in enumerate(heads):  # hold the same batches
            firsts.setdefault(int(h[0]), r)
        order = [firsts[s] for s in sorted(firsts)]
        total = sum(int(heads[r][1]) for r in order)
        if total == 0:
            return []
        source = next(r for r in order if int(heads[r][1]) > 0)
        spec = self._text("" if isinstance(joined, str) else joined[0], source)
        differs = ragged or (n > 0 and not isinstance(joined, str) and joined[0] != spec)
        if self._any(differs):
            self._say(total, "the ranks' last batches differ in structure or trailing shape")
            return []
        mine = [] if isinstance(joined, str) else joined[1]
        leaves = self._rows(mine if dist.get_rank(self.group) in order else [], spec, heads, order)
        plan = deal(total, len(order), max(int(h[2]) for h in heads))
        if plan.used < total:  # fewer than D samples left (or b = 1's S mod D)
            self._say(total - plan.used, f"too few to give each of {len(order)} data shards one")
        return pieces_of(spec, leaves, plan.pieces[sorted(firsts).index(self.shard)])

    def _gather(self, mine: torch.Tensor) -> list[torch.Tensor]:
        mine = mine.to(torch.int64).to(self.device or "cpu")
        out = [torch.empty_like(mine) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(out, mine, group=self.group)
        return [t.cpu() for t in out]

    def _any(self, flag: bool) -> bool:
        t = torch.tensor([int(flag)], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return bool(t.item())

    def _text(self, text: str, source: int) -> str:
        """``source``'s ``text`` on every rank: its length, then its bytes, as tensors."""
        mine = dist.get_rank(self.group) == source
        data = torch.tensor(list(text.encode()), dtype=torch.uint8)
        size = torch.tensor([len(data) if mine else 0], device=self.device)
        src = dist.get_global_rank(self.group, source) if self.group is not None else source
        dist.broadcast(size, src=src, group=self.group)
        buf = data if mine else torch.empty(int(size.item()), dtype=torch.uint8)
        buf = buf.to(self.device or "cpu")
        dist.broadcast(buf, src=src, group=self.group)
        return bytes(buf.cpu().tolist()).decode()

    def _rows(
        self, mine: list[torch.Tensor], spec: str, heads: list[torch.Tensor], order: list[int]
    ) -> list[torch.Tensor]:
        """Each leaf's rows of the shards in ``order``, joined: padded to the largest
        count for ``all_gather``, the padding cut off again."""
        widest = max(int(heads[r][1]) for r in order)
        shapes = _leaf_shapes(json.loads(spec))
        joined = []
        for i, (dtype, trailing) in enumerate(shapes):
            buf = torch.zeros([widest, *trailing], dtype=dtype)
            if mine:
                buf[: mine[i].shape[0]] = mine[i]
            wire = buf.view(torch.uint8) if dtype == torch.bool else buf  # gloo sends no bool
            wire = wire.to(self.device or "cpu")
            out = [torch.empty_like(wire) for _ in heads]
            dist.all_gather(out, wire, group=self.group)
            parts = [out[r].cpu()[: int(heads[r][1])] for r in order]
            joined.append(torch.cat(parts).view(dtype) if dtype == torch.bool else torch.cat(parts))
        return joined

    def _say(self, samples: int, why: str) -> None:
        self.untrained = samples
        if dist.get_rank(self.group) == 0:
            print(
                f"disttrain: a stream's last {samples} sample(s) were not trained this "
                f"epoch: {why}",
                file=sys.stderr,
            )


def _rows_in(batches: list[Any]) -> int:
    """The samples of ``batches`` that cannot be joined (for the line): each batch's first
    tensor leaf with a sample dimension, or none."""
    rows = 0
    for batch in batches:
        with contextlib.suppress(UsageError):  # no tensor with a sample dimension: none
            rows += num_samples(batch)
    return rows


def _leaf_shapes(tree: Any) -> list[tuple[torch.dtype, list[int]]]:
    """Every tensor leaf's dtype and trailing shape, in order, from a structure."""
    if "t" in tree:
        return [(getattr(torch, tree["t"][0]), list(tree["t"][1]))]
    nodes = [v for _, v in tree["d"]] if "d" in tree else tree.get("l", tree.get("u"))
    return [shape for node in nodes for shape in _leaf_shapes(node)]


def _refusal(leaf: str | None) -> str:
    where = leaf or "another worker's batch leaf (its own line names it)"
    return (
        f"run.loader: {where} is not a tensor: a stream's last batches are re-dealt among "
        "the workers as tensors (no pickle), so every leaf of its batches must be a "
        "tensor (collate strings into token ids, or leave them out)"
    )
