"""A model as a chain of layers: what a pipeline cuts, built from the module paths it keeps.

A pipeline cuts a chain: a sequence of layers each of which takes the previous
one's output tensor. An ``nn.Sequential`` is one already (its layers' paths are
``"0"``, ``"1"``, ...). A Hugging Face causal language model of the GPT-2 or
Llama families is made into one without copying or rewriting it: its embeddings,
each decoder block and its final norm with the head become the chain's layers,
each a thin wrapper that holds the model's own modules (so a stage trains the
model's own parameters, and the model itself is what comes back at the end) and
rebuilds what the model's ``forward`` computes outside its blocks (positions, the
causal mask, the rotary embedding) from the hidden states it is given. Only the
hidden states cross a stage boundary: what else a block needs of its micro-batch (a
padding ``attention_mask``) every stage slices from the batch it holds (every stage of
a pipeline is given the whole batch), under :func:`micro_batch`.

Families are recognised by their structure, not their class:

- GPT-2 (``GPT2LMHeadModel`` and its kin): ``transformer.wte``, ``transformer.wpe``,
  ``transformer.h`` (the blocks), ``transformer.ln_f``, ``lm_head``;
- Llama (Llama, Mistral, Qwen2 ...): ``model.embed_tokens``, ``model.layers``,
  ``model.norm``, ``model.rotary_emb``, ``lm_head``.

A split point (``--split-points transformer.h.2``) names the module a stage
starts with: a block's path, or the head's first module (a stage of the head
alone). Parameters the model ties (GPT-2's ``lm_head.weight`` is
``transformer.wte.weight``) are held by two stages: :func:`shared_parameters`
finds them, and the pipeline sums their gradients between the stages that hold
them, so that the copies stay equal.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from disttrain.comm.errors import UsageError

__all__ = [
    "Chain",
    "as_chain",
    "batch_norm_at",
    "micro_batch",
    "model_output",
    "shared_parameters",
    "split_sizes",
]


@dataclass
class Chain:
    """``layers`` (an ``nn.Sequential``), the module path each layer starts at, and the
    family (``sequential``, ``gpt2``, ``llama``); ``blocks``: the path of the block list;
    ``output(last, batch)``: what the model's ``forward`` returns, from the last layer's
    output and the batch (:func:`model_output`)."""

    layers: nn.Sequential
    paths: list[str]
    family: str
    blocks: str = ""
    output: Callable[[torch.Tensor, Any], Any] = lambda last, batch: last


def model_output(model: nn.Module) -> Callable[[torch.Tensor, Any], Any]:
    """The model's own output from its logits, for a causal LM whose ``forward`` is
    transformers' own: a ``CausalLMOutput`` with the ``logits`` and, when the batch holds
    ``labels``, the ``loss`` of the model's ``loss_function`` (as its ``forward`` computes
    them), so that a loss reading ``output.loss`` or ``output.logits`` reads the same from a
    pipeline's last stage as from the whole model. A ``forward`` of the user's own (one
    that returns the logits, say) gets its last layer's output as it is."""
    if not type(model).forward.__module__.startswith("transformers."):
        return lambda last, batch: last
    from transformers.modeling_outputs import CausalLMOutput

    vocab = model.config.vocab_size  # type: ignore[union-attr]
    loss_function = cast(Callable[..., torch.Tensor], model.loss_function)

    def output(logits: torch.Tensor, batch: Any) -> Any:
        labels = batch.get("labels") if isinstance(batch, Mapping) else None
        loss = None if labels is None else loss_function(logits, labels, vocab_size=vocab)
        return CausalLMOutput(loss=loss, logits=logits)

    return output


def _first(out: Any) -> torch.Tensor:
    """A block's hidden states (older transformers return a tuple)."""
    return out[0] if isinstance(out, tuple) else out


def _positions(h: torch.Tensor) -> torch.Tensor:
    return torch.arange(h.shape[1], device=h.device).unsqueeze(0)


#: the micro-batch a pipeline's stage is working on (forward, recompute, backward), as the
#: batch gave it: where a block finds its padding mask
_MICRO_BATCH: contextvars.ContextVar[Any] = contextvars.ContextVar("micro_batch", default=None)


@contextlib.contextmanager
def micro_batch(batch: Any) -> Iterator[None]:
    """While a stage works on ``batch`` (its slice of the step's batch, a dict for a
    transformers model): the blocks read its ``attention_mask`` there."""
    token = _MICRO_BATCH.set(batch)
    try:
        yield
    finally:
        _MICRO_BATCH.reset(token)


def _padding_mask() -> torch.Tensor | None:
    """The current micro-batch's ``attention_mask`` (1: a token, 0: padding), if it has one."""
    batch = _MICRO_BATCH.get()
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    return mask if isinstance(mask, torch.Tensor) else None


def _causal_mask(config: Any, h: torch.Tensor) -> Any:
    """The causal mask as the model's ``forward`` builds it, with the micro-batch's padding
    mask where it has one; positions 0..T-1 (no position ids given, so that without a
    padding mask nothing reads the tensors' values: a meta run has none)."""
    from transformers.masking_utils import create_causal_mask

    mask = _padding_mask()
    return create_causal_mask(
        config=config, inputs_embeds=h, attention_mask=mask, cache=None, position_ids=None
    )


class GPT2Embeddings(nn.Module):
    """Token and position embeddings, then the embedding dropout (``GPT2Model.forward``)."""

    def __init__(self, transformer: nn.Module) -> None:
        super().__init__()
        self.wte = _module(transformer, "wte")
        self.wpe = _module(transformer, "wpe")
        self.drop = _module(transformer, "drop")

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.wte(input_ids)
        return self.drop(h + self.wpe(_positions(h)))


class GPT2Layer(nn.Module):
    """One GPT-2 block, with the causal mask its model would give it."""

    def __init__(self, block: nn.Module, config: Any) -> None:
        super().__init__()
        self.block = block
        self.config = config

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        positions = _positions(h)
        mask = _causal_mask(self.config, h)
        return _first(self.block(h, None, mask, position_ids=positions))


class LlamaEmbeddings(nn.Module):
    def __init__(self, embed_tokens: nn.Module) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)


class LlamaLayer(nn.Module):
    """One decoder layer, with the causal mask and rotary embedding its model would give it
    (the rotary module has no parameters: each stage computes it for itself)."""

    def __init__(self, layer: nn.Module, rotary_emb: nn.Module, config: Any) -> None:
        super().__init__()
        self.layer = layer
        self.rotary_emb = rotary_emb
        self.config = config

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        positions = _positions(h)
        mask = _causal_mask(self.config, h)
        rotary = self.rotary_emb(h, position_ids=positions)
        return _first(
            self.layer(h, attention_mask=mask, position_ids=positions, position_embeddings=rotary)
        )


class Head(nn.Module):
    """The final norm and the output head: hidden states to logits."""

    def __init__(self, norm: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.norm, self.head = norm, head

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(h))


def _get(model: nn.Module, path: str) -> nn.Module | None:
    """The module at ``path`` of ``model`` (None: there is none)."""
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None


def _module(owner: nn.Module, name: str) -> nn.Module:
    got = getattr(owner, name)
    assert isinstance(got, nn.Module)
    return got


def _gpt2(model: nn.Module) -> Chain | None:
    t = _get(model, "transformer")
    head = _get(model, "lm_head")
    if t is None or head is None:
        return None
    if not all(isinstance(getattr(t, n, None), nn.Module) for n in ("wte", "wpe", "drop", "ln_f")):
        return None
    blocks = getattr(t, "h", None)
    if not isinstance(blocks, nn.ModuleList):
        return None
    config = getattr(model, "config", None)
    layers = [
        GPT2Embeddings(t),
        *(GPT2Layer(b, config) for b in blocks),
        Head(_module(t, "ln_f"), head),
    ]
    paths = [
        "transformer.wte",
        *(f"transformer.h.{i}" for i in range(len(blocks))),
        "transformer.ln_f",
    ]
    return Chain(nn.Sequential(*layers), paths, "gpt2", "transformer.h", model_output(model))


def _llama(model: nn.Module) -> Chain | None:
    inner = _get(model, "model")
    head = _get(model, "lm_head")
    if inner is None or head is None:
        return None
    names = ("embed_tokens", "norm", "rotary_emb")
    if not all(isinstance(getattr(inner, n, None), nn.Module) for n in names):
        return None
    blocks = getattr(inner, "layers", None)
    if not isinstance(blocks, nn.ModuleList):
        return None
    config = getattr(model, "config", None)
    rotary = _module(inner, "rotary_emb")
    layers = [
        LlamaEmbeddings(_module(inner, "embed_tokens")),
        *(LlamaLayer(b, rotary, config) for b in blocks),
        Head(_module(inner, "norm"), head),
    ]
    paths = ["model.embed_tokens", *(f"model.layers.{i}" for i in range(len(blocks))), "model.norm"]
    return Chain(nn.Sequential(*layers), paths, "llama", "model.layers", model_output(model))


def _sequential_paths(model: nn.Sequential) -> list[str]:
    return [name for name, _ in model.named_children()]


def as_chain(model: nn.Module, strategy: str) -> Chain:
    """``model`` as a chain of layers, or :class:`UsageError` naming what would be one."""
    if isinstance(model, nn.Sequential):
        return Chain(model, _sequential_paths(model), "sequential")
    for family in (_gpt2, _llama):
        chain = family(model)
        if chain is not None:
            return chain
    raise UsageError(
        f"--strategy {strategy} needs a model that is an nn.Sequential of layers or a "
        f"transformers causal LM of the GPT-2 or Llama families, got {type(model).__name__}: "
        "use --model mlp, cnn or gpt, or return nn.Sequential"
    )


def batch_norm_at(chain: Chain) -> str | None:
    """The path of the first BatchNorm among the chain's layers (None: none)."""
    for path, layer in zip(chain.paths, chain.layers, strict=True):
        for name, m in layer.named_modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                return f"{path}.{name}" if name and chain.family == "sequential" else path
    return None


def split_sizes(paths: Sequence[str], points: Sequence[str], stages: int, flag: str) -> list[int]:
    """Layers per stage when the stages start at the module paths ``points``, of a chain whose
    layers start at ``paths`` (:attr:`Chain.paths`); UsageError naming the path and what to
    change otherwise (``flag``: the stage count's flag)."""
    starts = {path: i for i, path in enumerate(paths)}
    choices = _choices(paths)
    cuts = []
    for point in points:
        if point not in starts:
            raise UsageError(_not_a_cut(paths, point, choices))
        if starts[point] == 0:
            raise UsageError(
                f"--split-points {point} is where the model starts (the first stage's first "
                f"module): name where later stages start, one of {choices}"
            )
        cuts.append(starts[point])
    if cuts != sorted(set(cuts)):
        raise UsageError(
            f"--split-points {','.join(points)}: name each split point once, in the model's "
            f"order ({choices})"
        )
    if len(cuts) + 1 != stages:
        raise UsageError(
            f"--split-points names {len(cuts)} split points, {len(cuts) + 1} stages, but there "
            f"are {stages} ({flag}): name {stages - 1} split points"
        )
    bounds = [0, *cuts, len(paths)]
    return [b - a for a, b in itertools.pairwise(bounds)]


def _choices(all_paths: Sequence[str]) -> str:
    paths = all_paths[1:]
    if len(paths) <= 4:
        return ", ".join(paths)
    return f"{paths[0]}, {paths[1]}, ..., {paths[-1]}"


def _not_a_cut(paths: Sequence[str], point: str, choices: str) -> str:
    # a module inside a layer (an attention inside a block): the layer's path is the cut
    inside = next((p for p in paths if point.startswith(p + ".")), None)
    if inside is not None:
        return (
            f"--split-points {point} is inside {inside}, not where a stage can start: split at "
            f"{inside} or another of {choices}"
        )
    return (
        f"--split-points {point} is not a module of the model that a stage can start at: "
        f"use one of {choices}"
    )


def shared_parameters(parts: Sequence[nn.Module]) -> list[tuple[list[int], nn.Parameter]]:
    """The parameters held by more than one of ``parts`` (tied weights), in the parts'
    order, each with the indices of the parts that hold it."""
    holders: dict[int, tuple[list[int], nn.Parameter]] = {}
    for s, part in enumerate(parts):
        for p in part.parameters():
            where, _ = holders.setdefault(id(p), ([], p))
            if s not in where:
                where.append(s)
    return [(where, p) for where, p in holders.values() if len(where) > 1]
