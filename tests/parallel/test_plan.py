"""Tensor-parallel plans (no processes): patterns matched to module paths, the built-in and
declared plans of transformers' GPT-2 and Llama, each refusal in one line naming the path,
and the slices' shapes (Linear, Conv1D, q/k/v packed, vocabulary rows) with the whole
tensor put back together from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from disttrain.comm.errors import UsageError
from disttrain.parallel import planned
from disttrain.parallel.plan import Style, resolve
from disttrain.parallel.tp_modules import join, slices_of, take
from tests.strategies.test_pipeline_any_model import tiny_gpt2, tiny_llama


def _llama(**config: int) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    sizes = {"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64}
    heads = {"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64}
    ids = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
    return LlamaForCausalLM(LlamaConfig(**{**sizes, **heads, **ids, **config}))


USE = "use a --workers that divides it"


def _refused(model: nn.Module, setting: str, size: int = 2) -> str:
    with pytest.raises(UsageError) as err:
        resolve(model, setting, size, "--workers")
    msg = str(err.value)
    assert "\n" not in msg, msg
    return msg


def test_gpt2s_built_in_plan_cuts_attention_by_heads_and_the_mlp_col_then_row() -> None:
    plan = resolve(tiny_gpt2(), "auto", 2, "--workers")
    assert plan is not None
    assert {p: s.name for p, s in plan.items() if ".h.1." in p} == {
        "transformer.h.1.attn": "attention",
        "transformer.h.1.attn.c_attn": "packed_colwise",
        "transformer.h.1.attn.c_proj": "rowwise",
        "transformer.h.1.mlp.c_fc": "colwise",
        "transformer.h.1.mlp.c_proj": "rowwise",
    }
    assert plan["transformer.h.0.attn.c_attn"] == Style("packed_colwise", 3)
    assert len(plan) == 10 and not any("wte" in p or "lm_head" in p for p in plan)


def test_llamas_plan_is_the_one_its_class_declares() -> None:
    plan = resolve(tiny_llama(), "auto", 2, "--workers")
    assert plan is not None
    styles = {p: s.name for p, s in plan.items()}
    assert styles["model.embed_tokens"] == "embedding_rowwise"
    assert styles["lm_head"] == "colwise_gather_output"
    assert styles["model.layers.1.self_attn.k_proj"] == "colwise"
    assert styles["model.layers.1.mlp.down_proj"] == "rowwise"
    assert len(styles) == 2 + 2 * 7


def test_a_sequential_has_no_plan_unless_given_one(tmp_path: Path) -> None:
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    assert resolve(mlp, "auto", 2, "--workers") is None
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"0": "colwise", "2": "rowwise"}))
    assert resolve(mlp, str(path), 2, "--workers") == {"0": Style("colwise"), "2": Style("rowwise")}
    inline = resolve(mlp, '{"0": "colwise_gather_output"}', 2, "--workers")
    assert inline == {"0": Style("colwise_gather_output")}
    assert "1 is a ReLU" in _refused(mlp, '{"*": "colwise"}')  # * matches the ReLU too


def test_a_pattern_star_matches_one_component_only() -> None:
    plan = resolve(tiny_llama(), '{"model.layers.*.mlp.up_proj": "colwise"}', 2, "--workers")
    assert plan is not None and sorted(plan) == [
        "model.layers.0.mlp.up_proj",
        "model.layers.1.mlp.up_proj",
    ]
    msg = _refused(tiny_llama(), '{"model.*.mlp.up_proj": "colwise"}')
    assert "'model.*.mlp.up_proj' matches no module of LlamaForCausalLM" in msg


def test_heads_and_widths_that_do_not_divide_are_refused_naming_the_path() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    three = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=24, n_head=3, vocab_size=64))
    msg = _refused(three, "auto")
    assert msg.startswith("transformer.h.0.attn: its num_heads (3) do not split into --workers 2")
    msg = _refused(_llama(num_key_value_heads=1), "auto")
    assert msg.startswith("model.layers.0.self_attn.k_proj: its heads (1) do not split")
    msg = _refused(_llama(vocab_size=63), "auto")  # the head's vocabulary, or the embedding's
    assert "its output features (63) do not split" in msg or "its rows (63) do not" in msg
    mlp = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 4))
    msg = _refused(mlp, '{"0": "colwise"}', size=4)
    assert msg == "0: its output features (6) do not split into --workers 4: " + USE


def test_bad_plans_are_refused_in_one_line(tmp_path: Path) -> None:
    gpt2 = tiny_gpt2()
    assert "unknown style 'columnwise'" in _refused(
        gpt2, '{"transformer.h.0.mlp.c_fc": "columnwise"}'
    )
    assert "is a LayerNorm: colwise cuts an nn.Linear" in _refused(
        gpt2, '{"transformer.ln_f": "colwise"}'
    )
    assert "no such file" in _refused(gpt2, str(tmp_path / "missing.json"))
    assert "not valid JSON" in _refused(gpt2, "{colwise")
    # the head is tied to the token embedding: cutting one of them would untie them
    msg = _refused(gpt2, '{"lm_head": "colwise_gather_output"}')
    assert "lm_head.weight is tied to transformer.wte.weight" in msg


def test_tied_weights_cut_alike_stay_one_parameter() -> None:
    model = _llama(tie_word_embeddings=True)
    model.tie_weights()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    plan = resolve(model, "auto", 2, "--workers")
    assert plan is not None
    part = planned.shard(model, plan, 1, 2, None, "native")
    assert part.lm_head.weight is part.model.embed_tokens.weight
    assert part.lm_head.weight.shape == (32, 32)


@pytest.mark.parametrize("blocks", [1, 3])
def test_slices_put_back_together_are_the_whole_tensor(blocks: int) -> None:
    t = torch.arange(4 * 12.0).reshape(4, 12)
    for dim in (0, 1):
        if t.shape[dim] % (2 * blocks):
            continue
        parts = [take(t, (dim, blocks), r, 2) for r in range(2)]
        assert torch.equal(join(parts, (dim, blocks)), t)
    q, k, v = take(torch.arange(12.0), (0, 3), 1, 2).chunk(3)  # rank 1: the second half of each
    assert q.tolist() == [2.0, 3.0] and k.tolist() == [6.0, 7.0] and v.tolist() == [10.0, 11.0]


def test_a_ranks_gpt2_holds_conv1d_slices_and_the_users_model_is_untouched() -> None:
    model = tiny_gpt2()
    plan = resolve(model, "auto", 2, "--workers")
    assert plan is not None
    part = planned.shard(model, plan, 0, 2, None, "native")
    attn, mlp = part.transformer.h[0].attn, part.transformer.h[0].mlp
    assert attn.c_attn.weight.shape == (32, 48) and attn.c_attn.bias.shape == (48,)  # (in, out)
    assert attn.c_proj.weight.shape == (16, 32) and attn.c_proj.bias.shape == (32,)
    assert mlp.c_fc.weight.shape == (32, 64) and mlp.c_proj.weight.shape == (64, 32)
    assert (attn.split_size, attn.num_heads) == (16, 1)
    # the user's model: whole, its attention unchanged; replicated modules are its own objects
    user = model.transformer.h[0].attn
    assert type(user.c_attn).__name__ == "Conv1D" and (user.split_size, user.num_heads) == (32, 2)
    assert part.transformer.wte is model.transformer.wte and part.lm_head is model.lm_head
    assert part.lm_head.weight is part.transformer.wte.weight
    assert part.transformer.h[0].ln_1 is model.transformer.h[0].ln_1
    assert not model._forward_pre_hooks and part._forward_pre_hooks


def test_linear_slices_keep_torchs_layout() -> None:
    lin = nn.Linear(8, 6)
    assert slices_of("colwise", 1, lin) == {"weight": (0, 1), "bias": (0, 1)}
    assert slices_of("rowwise", 1, lin) == {"weight": (1, 1)}  # the bias is replicated
    assert slices_of("embedding_rowwise", 1, nn.Embedding(8, 4)) == {"weight": (0, 1)}
    part = planned.shard(nn.Sequential(lin), {"0": Style("rowwise")}, 1, 2, None, "native")
    assert torch.equal(part[0].weight, lin.weight[:, 4:]) and part[0].bias is lin.bias
