"""ZeRO stage 3's units (what is gathered together), the model checks, a unit's outputs.

One process, no process group: these are functions of the model alone. The runs on
Hugging Face models (tied and untied GPT-2, units returning ModelOutputs) are in
tests/test_sharded_api.py.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple

import pytest
import torch
from torch import nn

from disttrain.comm.errors import UsageError
from disttrain.dataparallel.gather_units import (
    check_units,
    gather_units,
    layer_groups,
    layer_units,
    output_tensors,
)


class _TiedLM(nn.Module):
    """A language model's shape: the head's weight is the embedding's (GPT-2's tying)."""

    def __init__(self, tie: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 10, bias=False)
        if tie:
            self.head.weight = self.embed.weight
        self.scale = nn.Parameter(torch.ones(()))  # the root's own


def test_a_tied_weight_is_a_kept_unit_of_its_own_before_its_first_user() -> None:
    model = _TiedLM()
    units = gather_units(model)
    assert [u.name for u in units] == ["shared (embed.weight = head.weight)", "body", "<root>"]
    assert [u.kept for u in units] == [True, False, True]
    assert units[0].params == [model.embed.weight]
    assert units[0].users == [model.embed, model.head]  # both gather it at their forward
    assert units[1].params == [model.body.weight, model.body.bias]
    assert units[2].params == [model.scale] and units[2].users == [model]
    # every trainable parameter is in exactly one group, last unit first (backward's order)
    groups = layer_groups(model)
    assert [p for g in groups for p in g] == [
        model.scale,
        model.body.weight,
        model.body.bias,
        model.embed.weight,
    ]
    assert [m for m, _ in layer_units(model)] == [model.embed, model.body, model]


def test_untied_weights_are_layers() -> None:
    model = _TiedLM(tie=False)
    units = gather_units(model)
    assert [(u.name, u.kept) for u in units] == [
        ("embed", False),
        ("body", False),
        ("head", False),
        ("<root>", True),
    ]


def test_frozen_parameters_are_not_sharded() -> None:
    model = _TiedLM(tie=False)
    model.body.requires_grad_(False)
    assert [u.name for u in gather_units(model)] == ["embed", "head", "<root>"]


def test_a_model_zero3_cannot_pack_is_refused_in_one_line() -> None:
    mixed = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    mixed[0].bias.data = mixed[0].bias.data.double()
    with pytest.raises(UsageError, match=r"unit '0' mixes torch.float32 on cpu and torch.float64"):
        check_units(mixed)
    with pytest.raises(UsageError, match="no trainable parameters"):
        check_units(nn.Sequential(nn.ReLU()))
    assert len(check_units(nn.Sequential(nn.Linear(2, 2)))) == 1


@dataclass
class _Out:
    hidden: torch.Tensor
    extra: list[torch.Tensor]
    label: str = "x"


class _Pair(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


class _Opaque:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


def test_output_tensors_are_found_in_any_container() -> None:
    t = [torch.full((1,), float(i)) for i in range(7)]
    found = output_tensors(
        {
            "a": t[0],
            "b": [t[1], (t[2], None)],
            "c": _Out(t[3], [t[4]]),
            "d": OrderedDict(x=_Pair(t[5], t[6])),  # a ModelOutput is an OrderedDict
            "e": _Opaque(torch.zeros(1)),  # not a container: not found
            "f": "text",
        }
    )
    assert sorted(int(x.item()) for x in found) == list(range(7))
    assert output_tensors(t[0]) == [t[0]] and output_tensors(None) == []
