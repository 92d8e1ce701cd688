"""Our pipeline and tensor plan of transformers models against torch's own, paired rounds.

    disttrain bench hf-parallel --out benchmarks/results/hf_parallel/run-1

Every part runs in the same 2 local processes (gloo, one thread each): ours and the
anchor are built from the same seed (the same weights) and take one training step
each per round (forward, backward, SGD step), the order alternating from round to
round after two warm-up rounds (``pipeline._alternate_rounds``); ``paired`` is the
median over rounds of our step time over the anchor's in the same round, with its
quartiles; ``CPU`` the same ratio of both ranks' CPU seconds a step (``process_time``,
gloo's threads included: the work, free of the waits for a core). Each row also gives
the two sides' loss difference at step 1 (taken before the rounds: the same weights and
batch, so the same computation) and at the last step (the same number of SGD steps
since: the same training).

Pipeline: GPT-2 (4 blocks, width 128, 4 heads, vocabulary 512, its head tied to its
token embedding, no dropout, ``use_cache=False``), ``--microbatches`` M. Ours is the
library's pipeline strategy (``parallel/chain.py``: stages of the model's own modules)
under 1F1B (2 stages, split at ``transformer.h.2``) and interleaved (4 stages on 2
ranks, split at ``transformer.h.1``, ``.2``, ``.3``). The anchor is
``torch.distributed.pipelining``'s ``Schedule1F1B`` / ``ScheduleInterleaved1F1B`` on
stages (``--anchor``, one row each) traced by ``pipeline(model, mb_args,
split_spec=...)`` (``traced``: ``torch.export`` captures this GPT-2 once its config
says ``use_cache=False``; with the cache on it fails on the ``DynamicCache`` in the
output), or ``PipelineStage`` built by hand around our chain's stage modules
(``manual``: the same modules, so only the runtime differs). The traced stage 0 sends
the causal mask to every later stage: on 4 stages the interleaved schedule refuses
that skip connection, and the row records torch's error. torch leaves tied weights to
the user: its step is followed by the same sum of the embedding's and the head's
gradients over the two ranks that ours does.

Tensor: Llama (2 layers, hidden 128, 4 heads, 4 key-value heads, intermediate 256,
vocabulary 512) on 2 ranks, cut by transformers' ``base_model_tp_plan`` (q, k, v,
gate, up column-wise; o, down row-wise; embeddings and head whole): ours is the
library's tensor strategy with that plan (``parallel/planned.py``), the anchor
DTensor's ``parallelize_module`` with the same plan as ``ColwiseParallel`` /
``RowwiseParallel``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from disttrain.comm.errors import UsageError
from disttrain.lab.bench import pipeline as bench_pipeline

__all__ = ["PIPELINES", "add_arguments", "run", "spread"]

#: our schedule -> (stages, where each later stage starts)
PIPELINES: dict[str, tuple[int, list[str]]] = {
    "1f1b": (2, ["transformer.h.2"]),
    "interleaved": (4, ["transformer.h.1", "transformer.h.2", "transformer.h.3"]),
}
ANCHORS = ("traced", "manual")
LR = 0.1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parts", default="1f1b,interleaved,tensor", help="what to measure")
    parser.add_argument("--microbatches", type=int, default=4, help="pipeline micro-batches M")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--seq", type=int, default=64, help="tokens per sequence (<= 64)")
    parser.add_argument("--rounds", type=int, default=16, help="timed rounds (after 2 warm-up)")
    parser.add_argument(
        "--anchor",
        default="traced,manual",
        help="the pipeline anchor's stages, one row each: traced (torch's pipeline()), "
        "manual (PipelineStage around our stage modules)",
    )
    parser.add_argument(
        "--no-activation-meter",
        dest="activation_meter",
        action="store_false",
        help="diagnosis: our pipeline without its runner's saved-activation meter (a Python "
        "hook per saved tensor), to see what the meter costs",
    )
    parser.add_argument("--out", default="", help="folder for results.json and report.txt")


def _gpt2() -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    sizes: dict[str, Any] = {
        "n_layer": 4,
        "n_embd": 128,
        "n_head": 4,
        "vocab_size": 512,
        "n_positions": 64,
    }
    no_dropout: dict[str, Any] = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    cfg = GPT2Config(**sizes, **no_dropout, use_cache=False, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


def _llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    sizes: dict[str, Any] = {"num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 256}
    heads: dict[str, Any] = {"num_attention_heads": 4, "num_key_value_heads": 4}
    tokens: dict[str, Any] = {"vocab_size": 512, "max_position_embeddings": 64, "use_cache": False}
    ids: dict[str, Any] = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
    cfg = LlamaConfig(**sizes, **heads, **tokens, **ids)
    return LlamaForCausalLM(cfg)


def _ids(a: argparse.Namespace) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 512, (a.batch, a.seq), generator=g)


def _own_loss(output: Any, y: Any) -> torch.Tensor:
    """transformers' convention: the model's own loss of the batch's labels."""
    loss: torch.Tensor = output.loss
    return loss


def _ours_step(strategy: Any, part: nn.Module, batch: dict[str, torch.Tensor]) -> Callable[[], Any]:
    """One training step of a strategy of ours, as the trainer orders its hooks."""
    opt = torch.optim.SGD(part.parameters(), lr=LR)
    strategy.setup(part, opt)

    def step() -> Any:
        opt.zero_grad(set_to_none=True)
        loss = strategy.forward_backward(batch, batch)  # a pipeline feeds its input_ids
        strategy.after_backward()
        opt.step()
        return loss

    return step


def _our_pipeline(a: argparse.Namespace, sched: str, ids: torch.Tensor) -> Callable[[], Any]:
    from disttrain.comm import world
    from disttrain.config import load
    from disttrain.strategies.pipeline import Pipeline

    stages, points = PIPELINES[sched]
    flags = {"workers": 2, "strategy": "pipeline", "batch_size": a.batch, "schedule": sched}
    flags |= {"microbatches": a.microbatches, "split_points": ",".join(points)}
    if stages > 2:
        flags["virtual_stages"] = stages // 2
    strategy = Pipeline(load(flags), world.current(), _own_loss)
    part = strategy.prepare_model(_gpt2(), ids)
    if not getattr(a, "activation_meter", True):  # the diagnosis: ours without the meter
        strategy.runner.activations.recording = _no_recording  # type: ignore[method-assign]
    return _ours_step(strategy, part, {"input_ids": ids, "labels": ids})


@contextlib.contextmanager
def _no_recording(for_w: Callable[[], bool] | None = None) -> Iterator[list[Any]]:
    """``ActivationMeter.recording`` that counts nothing (no saved-tensor hooks): for the
    schedules measured here, which have no W action to read the saves."""
    yield []


def _anchor_stages(a: argparse.Namespace, how: str, sched: str, ids: torch.Tensor) -> list[Any]:
    """torch's PipelineStages of this rank (stages r, r+2, ...), traced or around our modules."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, SplitPoint, pipeline

    from disttrain.parallel import chain as chains
    from disttrain.parallel import placement

    rank, p = dist.get_rank(), dist.get_world_size()
    stages, points = PIPELINES[sched]
    cpu = torch.device("cpu")
    model = _gpt2()
    if how == "traced":
        spec = {point: SplitPoint.BEGINNING for point in points}
        pipe = pipeline(model, mb_args=(ids.chunk(a.microbatches)[0],), split_spec=spec)
        return [pipe.build_stage(s, cpu) for s in range(rank, stages, p)]
    chain = chains.as_chain(model, "pipeline")
    parts = placement.split(chain.layers, chains.split_sizes(chain.paths, points, stages, "stages"))
    return [PipelineStage(parts[s], s, stages, cpu) for s in range(rank, stages, p)]


def _anchor_pipeline(
    a: argparse.Namespace, how: str, sched: str, ids: torch.Tensor
) -> Callable[[], Any]:
    """A step of torch's schedule on its stages, then the tied gradients summed as ours are."""
    import torch.distributed as dist

    from disttrain.parallel.pipeline.schedule import torch_schedule_class

    rank = dist.get_rank()
    stages = _anchor_stages(a, how, sched, ids)
    vocab = 512
    loss_function = _gpt2().loss_function

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = loss_function(logits, labels, vocab_size=vocab)
        return out

    cls = torch_schedule_class(sched)
    sch = cls(stages if len(stages) > 1 else stages[0], a.microbatches, loss_fn=loss_fn)
    params = [q for s in stages for q in s.submod.parameters()]
    opt = torch.optim.SGD(params, lr=LR)
    # the tied pair: the first stage's embedding (rank 0), the last stage's head (rank p-1)
    tied = _tied(stages[0].submod if rank == 0 else stages[-1].submod, rank == 0)

    def step() -> Any:
        opt.zero_grad(set_to_none=True)
        losses: list[torch.Tensor] = []
        if rank == 0:
            sch.step(ids)
        else:
            sch.step(target=ids, losses=losses)
        grad = tied.grad if tied.grad is not None else torch.zeros_like(tied)
        dist.all_reduce(grad)
        tied.grad = grad
        opt.step()
        return torch.stack(losses).mean() if losses else None

    return step


def _tied(module: nn.Module, embedding: bool) -> nn.Parameter:
    """The stage's copy of GPT-2's tied weight: the embedding's on the first stage, the
    head's on the last (by name in a traced stage, by module in one of ours)."""
    want = "wte.weight" if embedding else "lm_head.weight"
    named = dict(module.named_parameters(remove_duplicate=False))
    hit = [q for n, q in named.items() if n.endswith(want)]
    if not hit:  # one of our chain's layers: GPT2Embeddings.wte, Head.head
        hit = [q for n, q in named.items() if n.endswith(("wte.weight", "head.weight"))]
    return hit[0]


def _pipeline_pair(a: argparse.Namespace, sched: str, how: str) -> dict[str, Any]:
    """Paired rounds of our pipeline and torch's on the same GPT-2, micro-batches and loss."""
    import torch.distributed as dist

    ids = _ids(a)
    ours, theirs = _our_pipeline(a, sched, ids), _anchor_pipeline(a, how, sched, ids)
    return _rounds(a, ours, theirs, last=dist.get_rank() == dist.get_world_size() - 1)


def _tensor_pair(a: argparse.Namespace) -> dict[str, Any]:
    """Paired rounds of our tensor plan and DTensor's on the same Llama, plan and batch."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from disttrain.comm import world
    from disttrain.config import load
    from disttrain.strategies.tensor import TensorParallel

    ids = _ids(a)
    batch = {"input_ids": ids, "labels": ids}
    model = _llama()
    plan = {f"model.{k}": v for k, v in model.config.base_model_tp_plan.items()}
    flags = {"workers": 2, "strategy": "tensor", "batch_size": a.batch, "tp_plan": json.dumps(plan)}
    strategy = TensorParallel(load(flags), world.current(), _own_loss)
    ours = _ours_step(strategy, strategy.prepare_model(model, ids), batch)

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    anchor = parallelize_module(_llama(), mesh, {k: styles[v]() for k, v in plan.items()})
    opt = torch.optim.SGD(anchor.parameters(), lr=LR)

    def theirs() -> Any:
        opt.zero_grad(set_to_none=True)
        loss = anchor(**batch).loss
        loss.backward()
        opt.step()
        return loss.detach()

    return _rounds(a, ours, theirs, last=True)


def _measure(a: argparse.Namespace, parts: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """On every rank: each (part, anchor) in turn, in these processes."""
    return [
        _tensor_pair(a) if part == "tensor" else _pipeline_pair(a, part, how) for part, how in parts
    ]


def _rounds(
    a: argparse.Namespace, ours: Callable[[], Any], theirs: Callable[[], Any], last: bool
) -> dict[str, Any]:
    """Step 1 of each side outside the timing (an anchor that raises there is the result,
    with its error), then the rounds; the losses of step 1 and of the last step (where
    ``last``: the rank that has both; the two sides have taken as many steps)."""
    first = {"ours": ours()}
    try:
        first["anchor"] = theirs()
    except Exception as exc:  # the anchor's own failure is the result to record
        return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    final: dict[str, Any] = {}
    cpu: dict[str, list[float]] = {"ours": [], "anchor": []}

    def keep(side: str, step: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            t0 = time.process_time()  # this process's CPU, gloo's threads included
            final[side] = step()
            cpu[side].append(time.process_time() - t0)

        return run

    ours_t, anchor_t = bench_pipeline._alternate_rounds(
        a.rounds, keep("ours", ours), keep("anchor", theirs)
    )
    return {
        "ours": ours_t,
        "anchor": anchor_t,
        "cpu": {k: v[2:] for k, v in cpu.items()},  # the timed rounds' (after 2 warm-up)
        "step1_loss": _floats(first) if last else {},
        "last_loss": _floats(final) if last else {},
    }


def _floats(losses: dict[str, Any]) -> dict[str, float]:
    return {k: float(v.detach()) for k, v in losses.items() if v is not None}


def spread(ours: list[float], anchor: list[float]) -> dict[str, float]:
    """Median step of each side, and the paired ratio's median and quartiles over rounds."""
    ratios = [o / t for o, t in zip(ours, anchor, strict=True)]
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios * 3)
    return {
        "ours": statistics.median(ours),
        "anchor": statistics.median(anchor),
        "paired": statistics.median(ratios),
        "q1": q1,
        "q3": q3,
    }


def _row(name: str, per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """One part's figures: rank 0's times (every rank's step is the slowest rank's, between
    barriers) and the losses from the rank that holds both."""
    held = next(r for r in reversed(per_rank) if r["step1_loss"])
    row: dict[str, Any] = {"part": name, **spread(per_rank[0]["ours"], per_rank[0]["anchor"])}
    for when in ("step1_loss", "last_loss"):
        loss = held[when]
        row[when] = loss | {"diff": abs(loss["ours"] - loss["anchor"])}
    row["rounds"] = {"ours": per_rank[0]["ours"], "anchor": per_rank[0]["anchor"]}
    # CPU seconds a step, both ranks together: the work, free of the waits for a core
    cpu = {
        k: [sum(c) for c in zip(*(r["cpu"][k] for r in per_rank), strict=True)]
        for k in ("ours", "anchor")
    }
    row["cpu"] = spread(cpu["ours"], cpu["anchor"]) | {"rounds": cpu}
    return row


def _parts(a: argparse.Namespace) -> list[tuple[str, str]]:
    """(part, anchor) to measure, in order; UsageError for anything else."""
    anchors = a.anchor.split(",")
    if not anchors or any(h not in ANCHORS for h in anchors):
        raise UsageError(f"--anchor {a.anchor}: use traced, manual or traced,manual")
    out: list[tuple[str, str]] = []
    for part in a.parts.split(","):
        if part in PIPELINES:
            out += [(part, how) for how in anchors]
        elif part == "tensor":
            out.append((part, "dtensor"))
        else:
            raise UsageError(f"--parts {a.parts}: use any of 1f1b, interleaved, tensor")
    return out


def _table_head(a: argparse.Namespace, group: str) -> list[str]:
    """A part's title and column names."""
    title = (
        f"Pipeline: GPT-2 (4 x 128, tied), batch {a.batch} x {a.seq} tokens, "
        f"M={a.microbatches}; ours: the pipeline strategy"
        + ("" if a.activation_meter else " without its activation meter")
        + "; anchor: torch.distributed.pipelining"
        if group == "pipeline"
        else f"Tensor: Llama (2 x 128) on 2 ranks, batch {a.batch} x {a.seq} tokens, "
        "base_model_tp_plan; ours: the tensor strategy; anchor: DTensor"
    )
    return [
        title,
        f"{'part':<12} {'anchor':<26} {'ours s':>8} {'anchor s':>9} {'paired':>7} "
        f"{'[q1, q3]':>14} {'CPU':>7}  loss: step 1 ours, |ours - anchor|; last step's",
    ]


def run(a: argparse.Namespace) -> int:
    parts = _parts(a)
    m = a.microbatches
    if m < 2 or m % 2 or a.batch % m:
        raise UsageError(
            f"--microbatches {m} must be even (interleaved: a multiple of the 2 ranks) and "
            f"divide --batch {a.batch}"
        )
    if not 2 <= a.seq <= 64 or a.rounds < 1:
        raise UsageError("--seq must be 2 to 64 (GPT-2's n_positions) and --rounds >= 1")
    lines = [
        f"{a.rounds} rounds after 2 warm-up, order alternating; paired = median over rounds "
        "of ours / anchor's step (wall), [quartiles]; CPU = the same of both ranks' CPU "
        "seconds a step"
    ]
    print(*lines, sep="\n", flush=True)
    rows = []
    per_rank = bench_pipeline._spawn(_measure, 2, (a, parts))  # every part, the same processes
    group = ""
    for i, (part, how) in enumerate(parts):
        if group != (group := "tensor" if part == "tensor" else "pipeline"):  # a new table
            lines += ["", *_table_head(a, group)]
            print(*lines[-3:], sep="\n", flush=True)
        label = "DTensor parallelize_module" if part == "tensor" else f"torch {how}"
        failed = next((r[i]["error"] for r in per_rank if "error" in r[i]), None)
        if failed is not None:
            rows.append({"part": part, "anchor_kind": how, "error": failed})
            line = f"{part:<12} {label:<26} anchor failed: {failed}"
        else:
            row = _row(part, [r[i] for r in per_rank]) | {"anchor_kind": how}
            rows.append(row)
            line = (
                f"{part:<12} {label:<26} {row['ours']:>8.4f} {row['anchor']:>9.4f} "
                f"{row['paired']:>7.3f} [{row['q1']:.3f}, {row['q3']:.3f}] "
                f"{row['cpu']['paired']:>7.3f}  "
                f"{row['step1_loss']['ours']:.6f}, {row['step1_loss']['diff']:.1e}; "
                f"{row['last_loss']['diff']:.1e}"
            )
        lines.append(line)
        print(line, flush=True)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        keys = ("parts", "anchor", "microbatches", "batch", "seq", "rounds", "activation_meter")
        settings = {k: getattr(a, k) for k in keys}
        with open(os.path.join(a.out, "results.json"), "w") as fh:
            json.dump({"settings": settings, "rows": rows}, fh, indent=2)
        with open(os.path.join(a.out, "report.txt"), "w") as fh:
            fh.write("\n".join(lines) + "\n")
        print(f"\nwrote {a.out}/results.json and {a.out}/report.txt")
    return 0
