"""Tensor-parallel plans of Hugging Face ``transformers`` models, found by the model's class.

GPT-2 declares none: its plan is built in here. ``c_attn`` is one ``Conv1D`` holding q, k
and v side by side, cut as three blocks (``packed_colwise:3``) so that each rank keeps
the same heads of each; the attention's ``split_size`` (and head count) become per-rank
(``attention``); ``c_proj`` row-wise; the MLP's ``c_fc`` column-wise, its ``c_proj``
row-wise. The embeddings and the head stay whole: the head is tied to ``wte``, and
GPT-2's vocabulary (50257) does not split.

Other classes (Llama, Mistral, Qwen2, ...) declare theirs: the model's ``_tp_plan``
(transformers puts the base model's ``base_model_tp_plan`` under its prefix, with the
head's own entries), else the config's ``base_model_tp_plan``. Entries with styles we do
not have (sequence parallelism, ``local_*``) are left out: those modules stay whole.
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["BUILT_IN", "GPT2", "declared"]

#: GPT-2's plan, relative to its base model (``GPT2Model``)
GPT2: dict[str, str] = {
    "h.*.attn": "attention",
    "h.*.attn.c_attn": "packed_colwise:3",
    "h.*.attn.c_proj": "rowwise",
    "h.*.mlp.c_fc": "colwise",
    "h.*.mlp.c_proj": "rowwise",
}
#: built-in plans by the base model's class name (it or a class it derives from)
BUILT_IN: dict[str, dict[str, str]] = {"GPT2Model": GPT2}


def _prefix(model: nn.Module, base: nn.Module) -> str:
    """The path of ``base`` in ``model`` with a trailing dot ("" when it is the model)."""
    if base is model:
        return ""
    return next(name for name, m in model.named_modules() if m is base) + "."


def declared(model: nn.Module) -> tuple[dict[str, Any], str] | None:
    """``model``'s plan (full module paths) and where it comes from; None: it has none."""
    base = getattr(model, "base_model", None)
    if not isinstance(base, nn.Module):
        return None
    for cls in type(base).__mro__:
        if cls.__name__ in BUILT_IN:
            prefix = _prefix(model, base)
            plan = {prefix + k: v for k, v in BUILT_IN[cls.__name__].items()}
            return plan, f"the built-in plan of {cls.__name__}"
    own = getattr(model, "_tp_plan", None)
    if isinstance(own, dict) and own:
        return dict(own), f"{type(model).__name__}'s tp plan"
    config_plan = getattr(getattr(model, "config", None), "base_model_tp_plan", None)
    if isinstance(config_plan, dict) and config_plan:
        prefix = _prefix(model, base)
        return {prefix + k: v for k, v in config_plan.items()}, "its config's base_model_tp_plan"
    return None
