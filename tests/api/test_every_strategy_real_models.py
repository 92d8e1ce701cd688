"""Every registered strategy, in each of its modes, on transformers' own models through
``dt.distribute`` (slow: ``make test-long``; its fast sibling is test_every_strategy.py's
regression, in ``make test``):

- GPT-2 from a small config (tied embeddings) on byte-level text, dict batches, the
  model's own ``outputs.loss``, 24 steps at global batch 24;
- ResNet from a small config (BatchNorm in every block) on an image folder read with PIL
  and a random flip, 2 loader worker processes, 24 steps at global batch 24.

At the same step count the held-out loss is within 2 % of allreduce's for the strategies
of the same mathematics and at most 25 % above it for those that talk less (issue 49's
bands; top-k on ResNet misses, a strict xfail with its figure), and
every rank's BatchNorm buffers equal rank 0's at the end. Pipeline, tensor and hybrid
(2 x 2 over a plan) cut GPT-2 (issue 50: its chain of blocks, its built-in plan) and are
held to the 2 % band; ResNet, which is neither a chain nor has a plan, they refuse in
one line.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest
import torch

from disttrain.registry import load_plugins
from disttrain.strategies import STRATEGIES
from tests.harness import SharedWorlds
from tests.modes import modes

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("api-real-models")]

WORLD, STEPS, BATCH = 4, 24, 24  # 24: 4, 3 (ps's workers) and 2 divide it
load_plugins()
SAME = {"allreduce", "zero", "ps:sync"}
#: model parallelism (activations cross ranks): the same mathematics as allreduce on GPT-2
#: (a chain, a plan); ResNet is refused
MODEL_PARALLEL = {n for n, kind in STRATEGIES.items() if kind.shares_activations}


def _workload(kind: str) -> tuple[Any, Any, Any]:
    from examples import workloads

    torch.manual_seed(0)
    if kind == "gpt2":
        train, test = workloads.byte_text()
        return workloads.gpt2(), train, test
    train, test = workloads.image_folder()
    return workloads.resnet(), train, test


def _held_out(model: torch.nn.Module, test: Any) -> float:
    from torch.utils.data import DataLoader

    model.eval()
    with torch.no_grad():
        losses = [float(model(**b).loss) * len(b["labels"]) for b in DataLoader(test, 64)]
    return sum(losses) / len(test)


def _train(kind: str, keywords: dict[str, Any]) -> Any:
    import disttrain as dt
    from disttrain.comm.errors import UsageError

    multiprocessing.current_process().daemon = False  # the loader's workers (test_run.py)
    model, train, test = _workload(kind)
    settings = dict(keywords)
    strategy = settings.pop("strategy")
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    try:
        run = dt.distribute(model, opt, strategy, batch_size=BATCH, **settings)
    except UsageError as exc:
        return {"refused": str(exc)}
    workers = {"num_workers": 2, "multiprocessing_context": "fork"} if kind == "resnet" else {}
    epoch = 0
    while run.steps < STEPS and not run.serves:
        for batch in run.loader(train, epoch=epoch, **workers):
            run.step(batch)
            if run.steps == STEPS:
                break
        epoch += 1
    if run.serves:
        run.serve()
        return None
    whole = run.finish()
    buffers = {k: v.clone() for k, v in run.model.named_buffers() if v.is_floating_point()}
    return {"loss": None if whole is None else _held_out(whole, test), "buffers": buffers}


CASES = modes()
KINDS = ("gpt2", "resnet")
JOBS = {f"{kind}/{label}": (WORLD, _train, (kind, kw)) for kind in KINDS for label, kw in CASES}
WORLDS = SharedWorlds(JOBS, timeout=900)


#: measured 2026-12-01 (24 steps, 4 ranks): top-k at 1 % with Adam ends ResNet at 0.340
#: against allreduce's 0.154 (2.2x); GPT-2 within the band
MISSES = {("resnet", "allreduce:topk")}


def _params() -> list[Any]:
    return [
        pytest.param(kind, label, marks=pytest.mark.xfail(strict=True, reason="top-k on ResNet"))
        if (kind, label) in MISSES
        else (kind, label)
        for kind in KINDS
        for label, _ in CASES
    ]


@pytest.mark.parametrize(("kind", "label"), _params())
def test_strategy_trains_a_transformers_model(kind: str, label: str) -> None:
    results = WORLDS.get(f"{kind}/{label}")
    model_parallel = label.split(":")[0] in MODEL_PARALLEL
    if model_parallel and kind == "resnet":
        said = results[0]["refused"]
        assert "ResNet" in said and "\n" not in said, said
        return
    anchor, got = WORLDS.get(f"{kind}/allreduce")[0]["loss"], results[0]["loss"]
    # BatchNorm's statistics: allreduce keeps rank 0's (as DDP), the parameter server
    # averages the workers' at the end, so on ResNet even its synchronous mode evaluates
    # with other running statistics (0.127 against 0.154, measured): the same parameters
    same = (label in SAME or model_parallel) and not (kind == "resnet" and label.startswith("ps"))
    if same:
        assert abs(got - anchor) <= 0.02 * anchor, f"{kind} {label}: {got:.4f} vs {anchor:.4f}"
    else:  # talking less may not cost more than 25 % (ending lower is no failure)
        assert got <= 1.25 * anchor, f"{kind} {label}: {got:.4f} vs allreduce {anchor:.4f}"
    trained = [r for r in results if r is not None]  # a parameter server's ranks serve
    for other in trained[1:]:
        for name, value in trained[0]["buffers"].items():
            assert torch.equal(value, other["buffers"][name]), f"{label}: {name} differs"
