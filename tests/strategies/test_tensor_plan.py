"""Tensor parallelism by a plan on transformers models (issue 50): GPT-2 (tied embeddings,
Conv1D, q/k/v fused) and Llama built from small configs, cut over 2 ranks by their plans
through ``dt.distribute``, equal the unsplit model trained in one process at the same
global batch after 20 steps of SGD (fp32, within 1e-5): every rank's slices, and the
model gathered back on rank 0; the tied embedding and head stay one Parameter. The
allreduces per step are counted: one per attention and one per MLP block each way
(Llama's q, k, v share one), plus the vocabulary-parallel embedding's and the head's.
A plan that cannot cut the model is refused in one line before any worker starts."""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests import zygote
from tests.harness import SharedWorlds
from tests.strategies.test_pipeline_any_model import MODELS, SEQ, VOCAB

STEPS, BATCH, TOL, LR = 20, 8, 1e-5, 0.5
ROOT = Path(__file__).resolve().parents[2]


def _batches() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        {
            "input_ids": torch.randint(0, VOCAB, (BATCH, SEQ), generator=g),
            "labels": torch.randint(0, VOCAB, (BATCH, SEQ), generator=g),
        }
        for _ in range(STEPS)
    ]


def _reference(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsplit model trained in one process on the whole batches (its own loss)."""
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for batch in _batches():
        opt.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}


def _worst_slice(part: nn.Module, want: dict[str, torch.Tensor], rank: int) -> float:
    """The largest difference of this rank's parameters from its slices of the reference."""
    from disttrain.parallel.tp_modules import take

    worst = 0.0
    for path, module in part.named_modules():
        cuts = getattr(module, "slices", {})
        for name, p in module.named_parameters(recurse=False):
            whole = want[f"{path}.{name}"]
            mine = take(whole, cuts[name], rank, 2) if name in cuts else whole
            worst = max(worst, (p - mine).abs().max().item())
    return worst


def _tensor(family: str) -> dict[str, Any]:
    """Llama by its class's plan (auto); GPT-2 by a plan of the user's, a dict (the built-in
    one written out: the docs block runs auto on GPT-2)."""
    import torch.distributed as dist

    import disttrain as dt
    from disttrain.collectives import set_length_check
    from disttrain.comm.meter import meter
    from disttrain.parallel.hf_plans import GPT2

    set_length_check(False)  # count the slicing's own messages, not the debug check's
    model = MODELS[family]()
    want = _reference(model)
    plan: Any = {f"transformer.{k}": v for k, v in GPT2.items()} if family == "gpt2" else "auto"
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    run = dt.distribute(model, opt, strategy="tensor", tp_plan=plan)
    data = _batches()
    run.step(data[0])
    meter.reset()
    for batch in data[1:]:
        run.step(batch)
    messages = meter.snapshot().messages_sent / (STEPS - 1)
    worst = _worst_slice(run.model, want, dist.get_rank())
    tied = family != "gpt2" or run.model.lm_head.weight is run.model.transformer.wte.weight
    saved = run.state_dict()["ranks"][dist.get_rank()]["model"]  # this rank's slices
    shapes = {k: tuple(v.shape) for k, v in saved.items() if k in SLICED[family]}
    whole = run.finish()
    if whole is not None:  # rank 0: the user's model, its slices gathered back
        assert whole is model
        for n, p in whole.named_parameters(remove_duplicate=False):
            worst = max(worst, (p - want[n]).abs().max().item())
        tied = tied and (family != "gpt2" or whole.lm_head.weight is whole.transformer.wte.weight)
    return {
        "worst": worst,
        "tied": tied,
        "held": sum(p.numel() for p in run.model.parameters()),  # this rank's, each once
        "messages": messages,
        "whole": whole is not None,
        "shapes": shapes,
    }


WORLDS = SharedWorlds({family: (2, _tensor, (family,)) for family in MODELS}, timeout=150)
#: 2-rank allreduces (2 messages each) per step: GPT-2's 2 blocks x (attention, MLP) x
#: (forward g, backward f); Llama's the same, its embedding's g and its head's backward f,
#: and the head's all-gather of the logits (1 message on 2 ranks)
MESSAGES = {"gpt2": 2 * 2 * 2 * 2, "llama": (2 * 2 * 2 + 2) * 2 + 1}
#: a row-wise projection's weight (input features halved) and a column-wise one's (output
#: features halved) in a rank's state; Conv1D's weight is (in, out), a Linear's (out, in)
SLICED = {
    "gpt2": {
        "transformer.h.0.attn.c_proj.weight": (16, 32),
        "transformer.h.0.mlp.c_fc.weight": (32, 64),
    },
    "llama": {
        "model.layers.0.self_attn.o_proj.weight": (32, 16),
        "model.layers.0.mlp.up_proj.weight": (32, 32),
    },
}


@pytest.mark.timeout(200)  # the first case runs the shared world
@pytest.mark.parametrize("family", list(MODELS))
def test_a_planned_transformer_equals_the_unsplit_model_after_20_steps(family: str) -> None:
    per_rank = WORLDS.get(family)
    assert [r["whole"] for r in per_rank] == [True, False]
    for r in per_rank:
        assert r["worst"] < TOL, (family, r["worst"])
        assert r["tied"]
        assert r["messages"] == MESSAGES[family], r["messages"]
    # run.state_dict(): each rank's own slices (Conv1D's weight is (in, out))
    assert per_rank[0]["shapes"] == per_rank[1]["shapes"] == SLICED[family]


def gpt2_model() -> nn.Module:
    """The test's GPT-2 as a factory of no arguments (``advise --model``)."""
    return MODELS["gpt2"]()


def llama_model() -> nn.Module:
    return MODELS["llama"]()


def test_advise_prices_a_rank_s_parameters_as_the_plan_cuts_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 50's "the lab prices the split model": advise's memory row for tensor on a
    transformers model is the parameters one rank of the real run above holds (fp32)."""
    from disttrain.cli import main

    monkeypatch.setattr("disttrain.lab.advise.DEFAULT_PATH", str(tmp_path / "none.json"))
    out = tmp_path / "rows.json"
    for family in MODELS:
        model = f"tests.strategies.test_tensor_plan:{family}_model"
        argv = ["advise", "--model", model, "--nodes", "2", "--strategies", "tensor"]
        assert main([*argv, "--json", str(out)]) == 0
        row = json.loads(out.read_text())["rows"][0]
        held = {r["held"] for r in WORLDS.get(family)}
        assert len(held) == 1  # the two ranks hold alike
        assert row["memory"]["parameters"] == pytest.approx(4 * held.pop(), rel=1e-9), family


def test_the_cli_refuses_heads_that_do_not_divide_with_exit_2_before_any_worker() -> None:
    spec = f"{ROOT / 'tests/strategies/test_pipeline_any_model.py'}:bytes_gpt2"
    flags = f"--strategy tensor --workers 3 --dataset pycode --seq-len {SEQ} --batch-size 6"
    argv = [sys.executable, "-m", "disttrain", "train", *flags.split(), "--model", spec]
    argv += ["--pycode-chars", "4000", "--out", "/nonexistent/never"]
    done = zygote.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "transformer.h.0.attn: its num_heads (2) do not split into --workers 3" in lines[0]


def test_tensor_mode_beside_a_plan_of_ones_own_is_refused() -> None:
    import disttrain.strategies  # noqa: F401  (registers the parallel settings)
    from disttrain.config import load
    from disttrain.launch.preflight import unread_settings

    plan = '{"0": "colwise"}'
    cfg = load({"workers": 2, "strategy": "tensor", "tp_plan": plan, "tensor_mode": "naive"})
    assert "tensor_mode" in unread_settings(cfg)


def test_tensor_mode_beside_a_built_in_plan_is_refused() -> None:
    """--tp-plan auto finds GPT-2's plan, so --tensor-mode would not be read: refused."""
    import disttrain.strategies  # noqa: F401  (registers the parallel settings)
    from disttrain.comm.errors import UsageError
    from disttrain.config import load
    from disttrain.parallel.settings import ParallelConfig
    from disttrain.strategies.tensor import check_tensor

    model = MODELS["gpt2"]()
    pc = load({"workers": 2, "strategy": "tensor", "tensor_mode": "naive"}).section(ParallelConfig)
    with pytest.raises(UsageError, match=r"--tensor-mode naive slices an nn\.Sequential"):
        check_tensor(model, 2, pc, "--workers")
    check_tensor(
        model, 2, replace(pc, tensor_mode="megatron"), "--workers"
    )  # the default: the plan cuts it
