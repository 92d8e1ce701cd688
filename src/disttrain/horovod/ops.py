"""Horovod's collectives: allreduce, allgather, broadcast, alltoall, reducescatter (plain,
in place, async, grouped, differentiable), with handles, ``poll``/``synchronize``, ``join``
and ``barrier``. Each call is queued on the engine's thread (:mod:`.engine`), which agrees
on it with the call's ranks, then moves the data with torch.distributed on gloo.

Numbers as Horovod: ``Average`` is a sum scaled by ``postscale / n``; integer tensors keep
their dtype and are truncated toward zero after each scaling (``7 / 2 -> 3``, ``-7 / 2 ->
-3``); float16 is scaled in float32, float32 by a float32 factor. gloo has no int16: such
tensors travel widened to int32 (reductions) or as their bytes (gathers, broadcasts).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from disttrain import ops as dt_ops
from disttrain.collectives import adasum
from disttrain.horovod import engine
from disttrain.horovod.compression import Compressor, NoneCompressor
from disttrain.horovod.engine import Call
from disttrain.horovod.exceptions import HorovodInternalError
from disttrain.horovod.process_sets import ProcessSet, global_process_set, resolve

__all__ = [
    "Adasum",
    "Average",
    "Max",
    "Min",
    "Product",
    "Sum",
    "allgather",
    "allgather_async",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "join",
    "poll",
    "reducescatter",
    "reducescatter_async",
    "synchronize",
]

Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_OP_NAMES = {
    Average: "Average",
    Sum: "Sum",
    Adasum: "Adasum",
    Min: "Min",
    Max: "Max",
    Product: "Product",
}
_REDUCE_INDEX = {Average: 0, Sum: 0, Min: 1, Max: 2, Product: 3}  # into engine.REDUCE_OPS
_REDUCIBLE = {
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
}
_WIDENED = {torch.int16: torch.int32}  # dtypes gloo cannot reduce -> what they travel as


# --- checks and arithmetic ----------------------------------------------------------------
def _resolve_op(average: bool | None, op: int | None) -> int:
    """Horovod's rule: ``op`` supersedes the deprecated ``average``; default Average."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if average is not None:
        warnings.warn(
            "Parameter `average` has been replaced with `op` and will be removed in v1.0",
            DeprecationWarning,
            stacklevel=3,
        )
        return Average if average else Sum
    if op is None:
        return Average
    if op not in _OP_NAMES:
        raise ValueError(
            f"unknown reduce op {op!r}: use hvd.Average, Sum, Adasum, Min, Max or Product"
        )
    return op


def _check(tensor: Any, dtypes: set[torch.dtype] | None = None) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.is_sparse:
        raise ValueError("sparse tensors are not supported (use sparse_as_dense)")
    if not tensor.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
    if dtypes is not None and tensor.dtype not in dtypes:
        raise ValueError(f"Tensor type {tensor.type()} is not supported.")
    if tensor.device.type != "cpu":
        raise ValueError("only CPU tensors are supported (gloo)")
    return tensor


def _scale_(t: torch.Tensor, factor: float) -> None:
    """``t *= factor`` with Horovod's rounding per dtype."""
    if factor == 1.0:
        return
    if not t.dtype.is_floating_point:  # in double, then truncated toward zero
        t.copy_((t.double() * factor).to(t.dtype))
    elif t.dtype in (torch.float16, torch.bfloat16):
        t.copy_(t.float() * torch.tensor(factor, dtype=torch.float32))
    else:
        t.mul_(torch.tensor(factor, dtype=t.dtype))


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """A tensor gloo cannot carry (int16) as uint8 rows of its bytes; others as they are."""
    if t.dtype not in _WIDENED:
        return t
    return t.reshape(t.shape[0], -1).view(torch.uint8)


def _from_rows(rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if like.dtype not in _WIDENED:
        return rows
    return rows.view(like.dtype).reshape(-1, *like.shape[1:])


def _submit(
    prefix: str,
    name: str | None,
    calls: list[Call],
    process_set: ProcessSet,
    finish: Any = None,
    keep: Any = None,
) -> int:
    group, _ = resolve(process_set)
    done = finish or (lambda results: results[0])
    return engine.current().submit(prefix, name, calls, group, done, keep)


# --- allreduce ------------------------------------------------------------------------------
def _adasum_call(out: torch.Tensor, pre: float, post: float, process_set: ProcessSet) -> Call:
    """Adasum of ``out`` over the global set, in place (collectives/adasum.py), as Horovod's
    CPU path: prescale, Adasum, postscale, and no division by the size (its divisor is 1).

    Horovod's refusals, at the call (horovod/torch/mpi_ops.py): a non-global set, then a
    size that is not a power of two (NotImplementedError). A dtype its Adasum cannot reduce
    (only float16/32/64) is a HorovodInternalError; Horovod raises that one at synchronize.
    """
    if process_set.process_set_id != 0:
        raise NotImplementedError("Adasum does not support non-global process sets yet.")
    group, ranks = resolve(process_set)
    if len(ranks) & (len(ranks) - 1):
        raise NotImplementedError("Running Adasum with non-power of 2 ranks is not supported yet.")
    if out.dtype not in adasum.DTYPES:
        raise HorovodInternalError(f"Adasum: unsupported data type {out.dtype}")

    def body() -> torch.Tensor:
        _scale_(out, pre)
        adasum.adasum_(out, group)
        _scale_(out, post)
        return out

    sig = f"allreduce|{out.dtype}|{list(out.shape)}|Adasum|{pre!r}|{post!r}"
    return Call(engine.ADASUM, sig, body, out.numel(), out.dtype)


def _allreduce_call(
    out: torch.Tensor, op: int, pre: float, post: float, process_set: ProcessSet
) -> Call:
    """Reduce ``out`` in place over the set (it already holds this rank's input)."""
    _check(out, _REDUCIBLE)
    if op == Adasum:
        return _adasum_call(out, pre, post, process_set)
    group, ranks = resolve(process_set)
    post_eff = post / len(ranks) if op == Average else post
    wire = _WIDENED.get(out.dtype, out.dtype)

    def body() -> torch.Tensor:
        buf = out if wire == out.dtype else out.to(wire)
        _scale_(buf, pre)
        dist.all_reduce(buf, op=engine.REDUCE_OPS[_REDUCE_INDEX[op]], group=group)
        _scale_(buf, post_eff)
        if buf is not out:
            out.copy_(buf)
        return out

    sig = f"allreduce|{out.dtype}|{list(out.shape)}|{_OP_NAMES[op]}|{pre!r}|{post!r}"
    return Call(engine.ALLREDUCE, sig, body, out.numel(), wire, _REDUCE_INDEX[op])


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Queue an in-place allreduce of ``tensor``; a handle for :func:`synchronize`."""
    op = _resolve_op(average, op)
    call = _allreduce_call(_check(tensor), op, prescale_factor, postscale_factor, process_set)
    return _submit("allreduce", name, [call], process_set, keep=tensor)


def allreduce_async(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Queue an allreduce into a new tensor (the input is left as it is)."""
    out = _check(tensor).detach().clone()
    return allreduce_async_(out, average, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Allreduce ``tensor`` in place; returns it."""
    return synchronize(
        allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set)
    )


class _Allreduce(torch.autograd.Function):
    """Backward: the same allreduce of the incoming gradient (Horovod's rule)."""

    @staticmethod
    def forward(
        ctx: Any,
        tensor: torch.Tensor,
        name: str | None,
        op: int,
        pre: float,
        post: float,
        process_set: ProcessSet,
    ) -> torch.Tensor:
        ctx.args = (op, pre, post, process_set)
        return synchronize(
            allreduce_async(tensor.contiguous(), None, name, op, pre, post, process_set)
        )

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        op, pre, post, ps = ctx.args
        out = synchronize(allreduce_async(grad.contiguous(), None, None, op, pre, post, ps))
        return out, None, None, None, None, None


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = NoneCompressor,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """The reduction of ``tensor`` over the set, as a new tensor; differentiable."""
    op = _resolve_op(average, op)
    compressed, ctx = compression.compress(tensor)
    out = _Allreduce.apply(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


# --- grouped allreduce ----------------------------------------------------------------------
def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Queue in-place allreduces of ``tensors`` under one handle (a tuple at synchronize)."""
    op = _resolve_op(average, op)
    if len({t.device for t in tensors}) > 1:
        raise ValueError("Tensors in list must be on same device.")
    calls = [
        _allreduce_call(_check(t), op, prescale_factor, postscale_factor, process_set)
        for t in tensors
    ]
    return _submit("grouped_allreduce", name, calls, process_set, tuple, keep=list(tensors))


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    outs = [_check(t).detach().clone() for t in tensors]
    return grouped_allreduce_async_(
        outs, average, name, op, prescale_factor, postscale_factor, process_set
    )


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> tuple[torch.Tensor, ...]:
    return synchronize(
        grouped_allreduce_async_(
            tensors, average, name, op, prescale_factor, postscale_factor, process_set
        )
    )


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = NoneCompressor,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Differentiable allreduce of each tensor (one differentiable call per tensor)."""
    op = _resolve_op(average, op)
    n = len(tensors)
    return [
        allreduce(
            t,
            None,
            None if name is None else f"{name}_{i + 1}of{n}",
            compression,
            op,
            prescale_factor,
            postscale_factor,
            process_set,
        )
        for i, t in enumerate(tensors)
    ]


# --- allgather ------------------------------------------------------------------------------
_GATHERABLE = _REDUCIBLE | {torch.bool}


def _allgather_call(tensor: torch.Tensor, process_set: ProcessSet) -> Call:
    _check(tensor, _GATHERABLE)
    if tensor.dim() == 0:
        raise ValueError("tried to allgather a rank-zero tensor: give it a first dimension")
    group, _ = resolve(process_set)

    def body() -> torch.Tensor:
        return _from_rows(dt_ops.allgather(_as_rows(tensor), group), tensor)

    sig = f"allgather|{tensor.dtype}|{list(tensor.shape[1:])}"
    return Call(engine.ALLGATHER, sig, body)


def allgather_async(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> int:
    """Queue the concatenation along dim 0 of every member's tensor (set-rank order)."""
    return _submit("allgather", name, [_allgather_call(tensor, process_set)], process_set)


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    calls = [_allgather_call(t, process_set) for t in tensors]
    return _submit("grouped_allgather", name, calls, process_set, tuple)


class _Allgather(torch.autograd.Function):
    """Backward: the gradient averaged over the set, then this rank's rows of it."""

    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, name: str | None, process_set: ProcessSet
    ) -> torch.Tensor:
        ctx.rows, ctx.process_set = tensor.shape[0], process_set
        return synchronize(allgather_async(tensor.contiguous(), name, process_set))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        ps = ctx.process_set
        mean = synchronize(allreduce_async(grad.contiguous(), op=Average, process_set=ps))
        rows = synchronize(allgather_async(torch.tensor([ctx.rows]), process_set=ps))
        _, ranks = resolve(ps)
        offset = int(rows[: ranks.index(engine.current().rank)].sum())
        return mean.narrow(0, offset, ctx.rows), None, None


def allgather(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """Every member's ``tensor`` concatenated along dim 0; first dims may differ."""
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    n = len(tensors)
    return [
        allgather(t, None if name is None else f"{name}_{i + 1}of{n}", process_set)
        for i, t in enumerate(tensors)
    ]


# --- broadcast ------------------------------------------------------------------------------
def broadcast_async_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Queue an in-place broadcast of global rank ``root_rank``'s tensor over the set."""
    _check(tensor, _GATHERABLE)
    group, ranks = resolve(process_set)
    if root_rank not in ranks:
        raise ValueError(f"broadcast root {root_rank} is not in the process set {ranks}")

    def body() -> torch.Tensor:
        wire = tensor.view(torch.uint8) if tensor.dtype in _WIDENED else tensor
        dist.broadcast(wire, src=root_rank, group=group)
        return tensor

    sig = f"broadcast|{tensor.dtype}|{list(tensor.shape)}|root {root_rank}"
    call = Call(engine.BROADCAST, sig, body)
    return _submit("broadcast", name, [call], process_set, keep=tensor)


def broadcast_async(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    return broadcast_async_(_check(tensor).detach().clone(), root_rank, name, process_set)


def broadcast_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _Broadcast(torch.autograd.Function):
    """Backward: the gradient averaged over the set on the root, zero elsewhere."""

    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None, process_set: ProcessSet
    ) -> torch.Tensor:
        ctx.root, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor.contiguous(), root_rank, name, process_set))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        mean = synchronize(
            allreduce_async(grad.contiguous(), op=Average, process_set=ctx.process_set)
        )
        if engine.current().rank != ctx.root:
            mean.zero_()
        return mean, None, None, None


def broadcast(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Root's tensor as a new tensor on every member; differentiable."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


# --- alltoall -------------------------------------------------------------------------------
def _splits(tensor: torch.Tensor, splits: Any, members: int) -> list[int]:
    """Validate ``splits`` (Horovod's local errors, ValueError) and return them as ints."""
    if splits is None:
        if tensor.shape[0] % members:
            raise ValueError(
                "splits not provided, but first dimension of tensor is not an even "
                "multiple of the number of workers."
            )
        return [tensor.shape[0] // members] * members
    if not isinstance(splits, torch.Tensor):
        splits = torch.tensor(list(splits), dtype=torch.int32)
    if splits.dim() != 1:
        raise ValueError("alltoall expects a 1D splits tensor")
    if splits.dtype != torch.int32:
        raise ValueError("alltoall expects splits to contain 32-bit integer elements.")
    if splits.numel() != members:
        raise ValueError(f"alltoall expects {members} splits, one per member: {splits.numel()}")
    out = [int(s) for s in splits.tolist()]
    if sum(out) > tensor.shape[0]:
        raise ValueError("Sum of splits entries is greater than the first dimension of tensor.")
    return out


def alltoall_async(
    tensor: torch.Tensor,
    splits: Any = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Queue an alltoall: ``splits[j]`` rows go to member j; synchronize gives (out, received)."""
    _check(tensor, _GATHERABLE)
    if tensor.dim() == 0:
        raise ValueError("alltoall needs a tensor with a first dimension")
    group, ranks = resolve(process_set)
    sent = _splits(tensor, splits, len(ranks))

    def body() -> tuple[torch.Tensor, torch.Tensor]:
        got = torch.empty(len(ranks), dtype=torch.int64)
        dist.all_to_all_single(got, torch.tensor(sent, dtype=torch.int64), group=group)
        rows = _as_rows(tensor[: sum(sent)])
        out = rows.new_empty((int(got.sum()), *rows.shape[1:]))
        dist.all_to_all_single(
            out, rows, output_split_sizes=got.tolist(), input_split_sizes=sent, group=group
        )
        return _from_rows(out, tensor), got.to(torch.int32)

    sig = f"alltoall|{tensor.dtype}|{list(tensor.shape[1:])}"
    return _submit("alltoall", name, [Call(engine.ALLTOALL, sig, body)], process_set)


class _Alltoall(torch.autograd.Function):
    """Backward: the reverse exchange of the gradient (rows not sent get zeros)."""

    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, splits: Any, name: str | None, process_set: ProcessSet
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, got = synchronize(alltoall_async(tensor.contiguous(), splits, name, process_set))
        ctx.got, ctx.rows, ctx.process_set = got, tensor.shape[0], process_set
        ctx.mark_non_differentiable(got)
        return out, got

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: Any) -> tuple[Any, ...]:
        back, _ = synchronize(
            alltoall_async(grad.contiguous(), ctx.got, process_set=ctx.process_set)
        )
        if back.shape[0] < ctx.rows:
            back = torch.cat([back, back.new_zeros((ctx.rows - back.shape[0], *back.shape[1:]))])
        return back, None, None, None


def alltoall(
    tensor: torch.Tensor,
    splits: Any = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """The rows every member sent this rank, in set-rank order; with ``splits`` given, also
    how many came from each (an int32 tensor). Differentiable."""
    out, got = _Alltoall.apply(tensor, splits, name, process_set)
    return out if splits is None else (out, got)


# --- reducescatter --------------------------------------------------------------------------
def _block(rows: int, members: int, index: int) -> tuple[int, int]:
    """(offset, length) of member ``index``'s block: the first ``rows % members`` get one more."""
    q, m = divmod(rows, members)
    return index * q + min(index, m), q + (1 if index < m else 0)


def _reducescatter_call(
    tensor: torch.Tensor, op: int, pre: float, post: float, process_set: ProcessSet
) -> Call:
    if op not in (Average, Sum):
        raise HorovodInternalError("reducescatter supports only hvd.Average and hvd.Sum")
    if _check(tensor).dim() == 0:
        raise ValueError("reducescatter needs a tensor with a first dimension")
    whole = tensor.detach().clone()
    reduce = _allreduce_call(whole, op, pre, post, process_set)
    _, ranks = resolve(process_set)
    offset, length = _block(tensor.shape[0], len(ranks), ranks.index(engine.current().rank))

    def body() -> torch.Tensor:
        return reduce.body().narrow(0, offset, length).clone()

    return Call(engine.REDUCESCATTER, "reducescatter" + reduce.signature, body)


def reducescatter_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Queue: reduce over the set, then member r keeps its block of dim 0."""
    call = _reducescatter_call(tensor, op, prescale_factor, postscale_factor, process_set)
    return _submit("reducescatter", name, [call], process_set)


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    calls = [
        _reducescatter_call(t, op, prescale_factor, postscale_factor, process_set) for t in tensors
    ]
    return _submit("grouped_reducescatter", name, calls, process_set, tuple)


class _Reducescatter(torch.autograd.Function):
    """Backward: the gradient times (set size for Sum) times the factors, allgathered."""

    @staticmethod
    def forward(
        ctx: Any,
        tensor: torch.Tensor,
        name: str | None,
        op: int,
        process_set: ProcessSet,
        pre: float,
        post: float,
    ) -> torch.Tensor:
        ctx.args = (op, process_set, pre, post)
        return synchronize(
            reducescatter_async(tensor.contiguous(), name, op, process_set, pre, post)
        )

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        op, ps, pre, post = ctx.args
        _, ranks = resolve(ps)
        grad = grad * ((len(ranks) if op == Sum else 1) * pre * post)
        return synchronize(allgather_async(grad.contiguous(), process_set=ps)), *[None] * 5


def reducescatter(
    tensor: torch.Tensor,
    name: str | None = None,
    compression: type[Compressor] = NoneCompressor,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    compressed, ctx = compression.compress(tensor)
    out = _Reducescatter.apply(compressed, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    compression: type[Compressor] = NoneCompressor,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    n = len(tensors)
    return [
        reducescatter(
            t,
            None if name is None else f"{name}_{i + 1}of{n}",
            compression,
            op,
            process_set,
            prescale_factor,
            postscale_factor,
        )
        for i, t in enumerate(tensors)
    ]


# --- control --------------------------------------------------------------------------------
def poll(handle: int) -> bool:
    """True once the collective of ``handle`` has finished (or failed)."""
    return engine.current().poll(handle)


def synchronize(handle: int) -> Any:
    """Wait for ``handle``; its output (HorovodInternalError if the ranks refused the call)."""
    return engine.current().wait(handle)


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Return when every member of the set has called it (after the calls queued before)."""
    synchronize(
        _submit("barrier", None, [Call(engine.BARRIER, "barrier", lambda: None)], process_set)
    )


def join(device: int = -1) -> int:
    """This rank has no more data: serve the others' allreduces with zeros until every
    rank has joined; return the rank that joined last (the same on every rank)."""
    return engine.current().join()
