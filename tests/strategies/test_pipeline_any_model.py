"""Pipelines of transformers models (issue 50): GPT-2 (tied embeddings) and Llama built from
small configs, cut at named module paths, equal the unsplit model trained in one process
at the same global batch after 20 steps of SGD (fp32, within 1e-5), and GPT-2's tied
embedding and head stay equal on both stages that hold them. A split point that is not a
stage boundary is refused in one line naming it, before any worker starts (exit 2)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests import zygote
from tests.harness import SharedWorlds

# one xdist worker runs the module: its shared world once, not once a worker (each worker
# given one of the cases would otherwise run all eleven jobs of the world)
pytestmark = pytest.mark.xdist_group("pipeline-any-model")

#: issue 50's 20 steps: a wrong gradient shows after one (SGD at lr 0.5 moves every
#: parameter far past 1e-5 each step), drift that grows over steps only later
STEPS, BATCH, SEQ, VOCAB = 20, 8, 8, 64
TOL = 1e-5
ROOT = Path(__file__).resolve().parents[2]


def tiny_gpt2(vocab: int = VOCAB) -> nn.Module:
    """GPT-2 of 2 blocks, its head tied to its token embedding, no dropout."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    sizes = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": vocab, "n_positions": SEQ}
    no_dropout = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    cfg = GPT2Config(**sizes, **no_dropout, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


def tiny_llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    sizes = {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64}
    heads = {"num_attention_heads": 2, "num_key_value_heads": 2}
    tokens = {"vocab_size": VOCAB, "max_position_embeddings": SEQ}
    ids = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
    cfg = LlamaConfig(**sizes, **heads, **tokens, **ids)
    return LlamaForCausalLM(cfg)


def bytes_gpt2() -> nn.Module:
    """The same on bytes (--dataset pycode's vocabulary of 256), returning its logits (what
    ``disttrain train``'s loss reads)."""
    from transformers import GPT2LMHeadModel

    class LogitsGPT2(GPT2LMHeadModel):
        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            return super().forward(input_ids).logits

    model = tiny_gpt2(256)
    model.__class__ = LogitsGPT2
    return model


MODELS = {"gpt2": tiny_gpt2, "llama": tiny_llama}
TIED = {"gpt2": ("transformer.wte.weight", "lm_head.weight")}


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (
            torch.randint(0, VOCAB, (BATCH, SEQ), generator=g),
            torch.randint(0, VOCAB, (BATCH, SEQ), generator=g),
        )
        for _ in range(STEPS)
    ]


def _padding(x: torch.Tensor) -> torch.Tensor:
    """An attention mask padding the first 3 positions of every odd sample (1: a token, 0:
    padding; on the left, where a token would attend to them unmasked): each micro-batch of
    2 or more holds as many tokens, so that the mean of the micro-batches' mean losses is
    the batch's (with unequal counts it weighs tokens unequally, as gradient accumulation
    does: docs/model-parallel.md)."""
    pads = 3 * (torch.arange(x.shape[0]) % 2)
    return (torch.arange(SEQ) >= pads[:, None]).long()


def _dict_batch(x: torch.Tensor, y: torch.Tensor, padded: bool) -> dict[str, torch.Tensor]:
    """A transformers batch: ids and labels, and with ``padded`` its padding mask (labels
    -100 there, as a collator pads them)."""
    if not padded:
        return {"input_ids": x, "labels": y}
    mask = _padding(x)
    return {"input_ids": x, "attention_mask": mask, "labels": y.masked_fill(mask == 0, -100)}


def _loss(output: Any, y: Any) -> torch.Tensor:
    """A user's loss of the model's own output (a pipeline's last stage rebuilds it)."""
    labels = y["labels"] if isinstance(y, dict) else y
    return F.cross_entropy(output.logits.flatten(0, 1), labels.flatten())


def _own_loss(output: Any, y: Any) -> torch.Tensor:
    """Hugging Face's convention (``run.step(batch)`` with no loss): the model's own."""
    return output.loss


def _sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.5)


def _reference(model: nn.Module, dicts: bool | str) -> dict[str, torch.Tensor]:
    """The unsplit model trained in one process on the whole batches (dict batches: with
    the model's own loss of its labels, shifted as transformers shifts them)."""
    model = copy.deepcopy(model)
    opt = _sgd(model.parameters())
    for x, y in _batches():
        opt.zero_grad(set_to_none=True)
        batch = _dict_batch(x, y, dicts == "padded")
        (model(**batch).loss if dicts else _loss(model(x), y)).backward()
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}


#: each (family, batch kind)'s reference, in the rank that computed it (read, never written)
_REFERENCES: dict[tuple[str, bool | str], dict[str, torch.Tensor]] = {}


def _pipeline(family: str, flags: dict[str, Any], dicts: bool | str = False) -> dict[str, Any]:
    """Train ``family``'s model on this rank's stage as the trainer orders the hooks; the
    largest difference from the reference, and this rank's copies of the tied weights."""
    from disttrain.comm import world
    from disttrain.config import load
    from disttrain.strategies.pipeline import Pipeline, PipelineSettings

    model = MODELS[family]()
    if (family, dicts) not in _REFERENCES:  # the same model (seed 0) and batches: once a rank
        _REFERENCES[family, dicts] = _reference(model, dicts)
    want = _REFERENCES[family, dicts]
    cfg = load({"workers": 2, "strategy": "pipeline", "batch_size": BATCH, **flags})
    PipelineSettings.validate_config(cfg, model)  # pre-flight's check
    strategy = Pipeline(cfg, world.current(), _own_loss if dicts else _loss)
    data = _batches()
    part = strategy.prepare_model(model, data[0][0])
    opt = _sgd(part.parameters())
    strategy.setup(part, opt)
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        if dicts:  # a transformers batch: the ids feed stage 0, the labels the model's loss
            batch = _dict_batch(x, y, dicts == "padded")  # a padding mask: every stage's
            strategy.forward_backward(batch, batch)
        else:
            strategy.forward_backward(x, y)
        strategy.after_backward()
        opt.step()
    held = {id(p) for p in part.parameters()}  # a tied parameter: both its names
    mine = {n for n, p in model.named_parameters(remove_duplicate=False) if id(p) in held}
    by_name = dict(model.named_parameters(remove_duplicate=False))
    worst = max((by_name[n] - want[n]).abs().max().item() for n in mine)
    whole = strategy.eval_model()
    if whole is not None:  # rank 0: the whole model, every stage's parameters gathered
        for n, p in whole.named_parameters(remove_duplicate=False):
            worst = max(worst, (p - want[n]).abs().max().item())
    # which of the tied pair this rank's stages use: the embedding on the first, the head
    # on the last (one object in each process; its gradient is summed over both ranks)
    uses = {"transformer.wte.weight": 0, "lm_head.weight": 1}
    tied = {
        n: by_name[n].detach().tolist() for n in TIED.get(family, ()) if uses[n] == strategy.stage
    }
    return {"worst": worst, "sizes": strategy.sizes, "tied": tied, "whole": whole is not None}


CASES: dict[str, tuple[str, dict[str, Any], bool | str]] = {
    "gpt2-gpipe": ("gpt2", {"schedule": "gpipe", "microbatches": 4}, False),
    "gpt2-1f1b": (
        "gpt2",
        {"schedule": "1f1b", "microbatches": 4, "split_points": "transformer.h.0"},
        False,
    ),
    "gpt2-zb1-dict": ("gpt2", {"schedule": "zb1", "microbatches": 4}, True),
    "gpt2-interleaved": (
        "gpt2",
        {
            "schedule": "interleaved",
            "microbatches": 4,
            "virtual_stages": 2,
            "split_points": "transformer.h.0,transformer.h.1,transformer.ln_f",
        },
        False,
    ),
    "llama-1f1b": ("llama", {"schedule": "1f1b", "microbatches": 2}, False),
    # the other schedules on the other family: every schedule on both
    "gpt2-zb2": ("gpt2", {"schedule": "zb2", "microbatches": 4}, False),
    "llama-gpipe": ("llama", {"schedule": "gpipe", "microbatches": 2}, False),
    "llama-zb1-dict": ("llama", {"schedule": "zb1", "microbatches": 2}, True),
    "llama-interleaved": (
        "llama",
        {
            "schedule": "interleaved",
            "microbatches": 4,
            "virtual_stages": 2,
            "split_points": "model.layers.0,model.layers.1,model.norm",
        },
        False,
    ),
    # padded sequences: each stage's blocks read their micro-batch's attention_mask
    "gpt2-1f1b-padded": ("gpt2", {"schedule": "1f1b", "microbatches": 4}, "padded"),
    "llama-zb2-padded": ("llama", {"schedule": "zb2", "microbatches": 2}, "padded"),
}

WORLDS = SharedWorlds(
    {
        name: (2, _pipeline, (family, flags, dicts))
        for name, (family, flags, dicts) in CASES.items()
    },
    timeout=240,
)


@pytest.mark.timeout(300)  # the first case run pays for the whole world's eleven jobs
@pytest.mark.parametrize("case", list(CASES))
def test_a_split_transformer_equals_the_unsplit_model_after_20_steps(case: str) -> None:
    family, flags, _ = CASES[case]
    per_rank = WORLDS.get(case)
    assert [r["whole"] for r in per_rank] == [True, False]
    for r in per_rank:
        assert r["worst"] < TOL, (case, r["worst"])
        assert sum(r["sizes"]) == 4  # embeddings, 2 blocks, norm and head
    if "split_points" in flags:
        cut = {"transformer.h.0": [1, 3]}.get(flags["split_points"], [1, 1, 1, 1])
        assert per_rank[0]["sizes"] == cut
    if family in TIED:  # the embedding on the first stage, the head on the last: equal
        embedding, head = TIED[family]
        first, last = per_rank[0]["tied"], per_rank[1]["tied"]
        assert embedding in first and head in last
        assert first[embedding] == last[head]


def _refused(model: nn.Module, **flags: Any) -> str:
    from disttrain.comm.errors import UsageError
    from disttrain.config import load
    from disttrain.strategies.pipeline import PipelineSettings

    cfg = load({"workers": 2, "strategy": "pipeline", "batch_size": BATCH, **flags})
    with pytest.raises(UsageError) as err:
        PipelineSettings.validate_config(cfg, model)
    return str(err.value)


def test_a_split_point_that_is_not_a_stage_boundary_is_refused_naming_it() -> None:
    gpt2 = tiny_gpt2()
    msg = _refused(gpt2, split_points="transformer.h.7")
    assert "transformer.h.7" in msg and "transformer.h.0" in msg and "\n" not in msg
    msg = _refused(gpt2, split_points="transformer.h.1.attn")
    assert "is inside transformer.h.1" in msg and "split at transformer.h.1" in msg
    msg = _refused(gpt2, split_points="transformer.h.0,transformer.h.1")
    assert "name 1 split points" in msg
    from disttrain.config import load
    from disttrain.launch.preflight import unread_settings

    cfg = load({"workers": 2, "strategy": "pipeline", "split_points": "1", "balance": "time"})
    assert "balance" in unread_settings(cfg)  # pre-flight refuses --balance beside them
    bn = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    msg = _refused(bn, microbatches=4)
    assert "BatchNorm at 1" in msg and "micro-batch of 2 samples" in msg


def test_the_cli_refuses_a_bad_split_point_with_exit_2_before_any_worker() -> None:
    spec = f"{Path(__file__).resolve()}:bytes_gpt2"
    flags = "train --strategy pipeline --workers 2 --dataset pycode --pycode-chars 4000"
    flags += " --split-points transformer.h.9 --out /nonexistent/never"
    argv = [sys.executable, "-m", "disttrain", *flags.split(), "--model", spec]
    argv += ["--seq-len", str(SEQ)]
    # forked from the test process's zygote (torch imported once): the command as it runs
    done = zygote.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "transformer.h.9" in lines[0], done.stderr
