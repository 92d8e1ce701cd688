"""A tensor-parallel plan: module-path patterns to how each module is cut, parsed and matched.

A plan is a mapping such as DTensor's ``parallelize_module`` and transformers'
``base_model_tp_plan`` take::

    {"model.layers.*.self_attn.q_proj": "colwise", "model.layers.*.self_attn.o_proj": "rowwise"}

A pattern is a module path (``named_modules``' names) whose ``*`` components match any
one component. Styles (:mod:`disttrain.parallel.tp_modules` says what each does):
``colwise``, ``rowwise``, ``colwise_gather_output``, ``packed_colwise`` (``:N`` blocks,
2 by default: a fused gate/up), ``embedding_rowwise``, and ``attention``: a module whose
head counts and widths become per-rank (its int attributes among :data:`HEAD_ATTRIBUTES`
divided by T; GPT-2's attention splits its fused q, k, v by ``split_size``).

``--tp-plan auto`` (the default) takes the built-in plan of the model's class, else the
one its class declares (:mod:`disttrain.parallel.hf_plans`); a model with neither gets
no plan (an ``nn.Sequential``'s Megatron pairs). ``--tp-plan PATH.json`` or an inline
JSON object (``tp_plan={...}`` in ``dt.distribute``) is the user's own. Everything is
checked here, before any worker starts: a pattern that matches nothing, a module the
style cannot cut, widths or heads that do not divide into T, a tied weight cut two ways.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from torch import nn

from disttrain.comm.errors import UsageError
from disttrain.parallel import hf_plans
from disttrain.parallel.tp_modules import Slice, is_conv1d, slices_of, widths

__all__ = ["HEAD_ATTRIBUTES", "STYLES", "Style", "match", "parse", "resolve"]

STYLES = (
    "colwise",
    "rowwise",
    "colwise_gather_output",
    "packed_colwise",
    "embedding_rowwise",
    "attention",
)
#: the attributes an ``attention`` module's forward reads its per-rank shapes from
HEAD_ATTRIBUTES = ("num_heads", "num_key_value_heads", "split_size", "embed_dim")


@dataclass(frozen=True)
class Style:
    """A plan entry's style and, for ``packed_colwise``, the number of blocks."""

    name: str
    blocks: int = 1


def parse_style(text: Any, where: str) -> Style:
    """``"colwise"``, ``"packed_colwise:3"``, ... or UsageError naming ``where``."""
    name, _, count = str(text).partition(":")
    if not isinstance(text, str) or name not in STYLES or (count and name != "packed_colwise"):
        raise UsageError(f"{where}: unknown style {text!r}: use one of {', '.join(STYLES)}")
    if name != "packed_colwise":
        return Style(name)
    if count and (not count.isdigit() or int(count) < 1):
        raise UsageError(f"{where}: {text!r} needs a block count >= 1 (packed_colwise:3)")
    return Style(name, int(count) if count else 2)


def parse(setting: str) -> dict[str, Any] | None:
    """The user's plan of ``--tp-plan`` (a JSON file or an inline JSON object); None: auto."""
    if setting == "auto":
        return None
    text = setting
    if not setting.lstrip().startswith("{"):
        if not os.path.isfile(setting):
            raise UsageError(
                f"--tp-plan {setting}: no such file: give auto, a JSON file, or a JSON object"
            )
        with open(setting, encoding="utf-8") as fh:
            text = fh.read()
    try:
        plan = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--tp-plan {setting}: not valid JSON ({exc})") from None
    if not isinstance(plan, dict) or not all(isinstance(k, str) for k in plan):
        raise UsageError(f"--tp-plan {setting}: a plan is a JSON object of module paths to styles")
    for pattern, style in plan.items():
        parse_style(style, f"--tp-plan entry {pattern!r}")
    return plan


def _matches(pattern: list[str], path: list[str]) -> bool:
    if len(pattern) != len(path):
        return False
    return all(p in ("*", c) for p, c in zip(pattern, path, strict=True))


def match(model: nn.Module, plan: dict[str, Any], source: str, strict: bool) -> dict[str, Style]:
    """Each module path of ``model`` a pattern of ``plan`` names, with its style. ``strict``
    (a user's plan): a pattern that matches no module is refused, naming it."""
    paths = [name for name, _ in model.named_modules() if name]
    out: dict[str, Style] = {}
    for pattern, text in plan.items():
        style = parse_style(text, f"{source} entry {pattern!r}")
        hits = [p for p in paths if _matches(pattern.split("."), p.split("."))]
        if not hits and strict:
            near = ", ".join(paths[:3]) + (", ..." if len(paths) > 3 else "")
            raise UsageError(
                f"{source} entry {pattern!r} matches no module of {type(model).__name__}: "
                f"name module paths such as {near} (* for any one component)"
            )
        for path in hits:
            if out.get(path, style) != style:
                raise UsageError(
                    f"{source}: {path} is matched as {out[path].name} and as {style.name}: "
                    "give each module one style"
                )
            out[path] = style
    return out


def _refuse(path: str, what: str, size: int, flag: str) -> UsageError:
    return UsageError(
        f"{path}: {what} do not split into {flag} {size}: use a {flag} that divides it"
    )


def _check_module(model: nn.Module, path: str, style: Style, size: int, flag: str) -> None:
    """UsageError unless ``style`` can cut the module at ``path`` into ``size`` slices."""
    module = model.get_submodule(path)
    kind = type(module).__name__
    if style.name == "attention":
        held = {
            a: getattr(module, a)
            for a in HEAD_ATTRIBUTES
            if isinstance(getattr(module, a, None), int)
        }
        if not held:
            raise UsageError(
                f"{path} ({kind}) has none of {', '.join(HEAD_ATTRIBUTES)}: the attention "
                "style makes those per-rank; leave it out of the plan"
            )
        for a, v in held.items():
            if v % size:
                raise _refuse(path, f"its {a} ({v})", size, flag)
        return
    if style.name == "embedding_rowwise":
        if not isinstance(module, nn.Embedding) or module.max_norm is not None:
            raise UsageError(
                f"{path} ({kind}): embedding_rowwise cuts an nn.Embedding without max_norm"
            )
        if module.num_embeddings % size:
            raise _refuse(path, f"its rows ({module.num_embeddings})", size, flag)
        return
    if not (isinstance(module, nn.Linear) or is_conv1d(module)):
        raise UsageError(
            f"{path} is a {kind}: {style.name} cuts an nn.Linear or a transformers Conv1D; "
            "leave it out of the plan (it is then replicated)"
        )
    n_in, n_out = widths(module)
    width, unit = (n_in, 1) if style.name == "rowwise" else (n_out, style.blocks)
    if width % (unit * size):
        side = "input" if style.name == "rowwise" else "output"
        what = f"its {side} features ({width}" + (f" in {unit} blocks)" if unit > 1 else ")")
        raise _refuse(path, what, size, flag)
    _check_heads(model, path, width // unit, size, flag)


def _check_heads(model: nn.Module, path: str, width: int, size: int, flag: str) -> None:
    """An attention projection (its parent has a ``head_dim``) is cut between heads."""
    parent = model.get_submodule(path.rpartition(".")[0]) if "." in path else model
    head_dim = getattr(parent, "head_dim", None)
    if isinstance(head_dim, int) and head_dim > 0 and width % (head_dim * size) == 0:
        return
    if isinstance(head_dim, int) and head_dim > 0:
        raise _refuse(path, f"its heads ({width // head_dim})", size, flag)


def _check_ties(model: nn.Module, plan: dict[str, Style]) -> None:
    """A parameter two modules hold (a tied embedding and head) is cut alike by both, or
    by neither: one object, one slice on each rank."""
    cuts: dict[int, tuple[str, Slice | None]] = {}
    for path, module in model.named_modules(remove_duplicate=False):
        style = plan.get(path)
        per = (
            {}
            if style is None or style.name == "attention"
            else slices_of(style.name, style.blocks, module)
        )
        for name, p in module.named_parameters(recurse=False):
            here = f"{path}.{name}" if path else name
            cut = per.get(name)
            seen = cuts.setdefault(id(p), (here, cut))
            if seen[1] != cut:
                raise UsageError(
                    f"{here} is tied to {seen[0]} and the plan cuts them differently: cut "
                    "both alike (embedding_rowwise with colwise_gather_output) or neither"
                )


def resolve(model: nn.Module, setting: str, size: int, flag: str) -> dict[str, Style] | None:
    """The checked plan ``--tp-plan`` gives ``model`` over ``size`` ranks (``flag``: the
    flag that sets the size, for messages); None: no plan (auto on a model without one)."""
    given = parse(setting)
    if given is None:
        found = hf_plans.declared(model)
        if found is None:
            return None
        plan, source = found
        plan = {k: v for k, v in plan.items() if str(v).partition(":")[0] in STYLES}
        assigned = match(model, plan, source, strict=False)
    else:
        assigned = match(model, given, "--tp-plan", strict=True)
    for path, style in assigned.items():
        _check_module(model, path, style, size, flag)
    _check_ties(model, assigned)
    return assigned
