"""checkpoint.dcp: a state packed into one DCP entry per dtype reads back equal, unshared."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp_api

from disttrain.checkpoint import dcp


def _state() -> dict[str, object]:
    g = torch.Generator().manual_seed(0)
    return {
        "model": {"w": torch.randn(3, 4, generator=g), "b": torch.randn(4, generator=g),
                  "empty": torch.zeros(0, 5), "scalar": torch.tensor(2.5)},
        "optimizer": {"state": {0: {"step": torch.tensor(7, dtype=torch.int64),
                                    "buf": torch.randn(4, 3, generator=g).t()}},  # strided
                      "param_groups": [{"lr": 0.1, "params": [0]}]},
        "rng": torch.get_rng_state(),  # uint8
        "half": torch.randn(5, generator=g).half(),
        "pair": (1, "two", None, True),
    }  # fmt: skip


def _equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_equal, a, b))  # type: ignore[arg-type]
    return a == b


def test_a_packed_state_reads_back_equal_with_one_entry_per_dtype(tmp_path: Path) -> None:
    state, folder = _state(), str(tmp_path / "part")
    dcp.write(folder, {"format": "x"}, dcp.pack(state))
    header, back = dcp.read(folder)
    assert header == {"format": "x"} and _equal(state, back)
    entries = dcp._SafeReader(folder).read_metadata().state_dict_metadata
    assert sorted(entries) == ["pack:float16", "pack:float32", "pack:int64", "pack:uint8"]
    # each tensor read back owns its storage: a write to one leaves the others alone
    model = back["model"]
    assert isinstance(model, dict)
    model["b"].add_(1.0)
    assert torch.equal(model["w"], state["model"]["w"])  # type: ignore[index]
    assert model["w"].untyped_storage().nbytes() == 12 * 4


def test_the_packs_are_a_copy_and_reuse_their_buffers_when_the_sizes_match() -> None:
    w = torch.ones(6)
    reuse: dict[str, torch.Tensor] = {}
    _, first = dcp.pack({"w": w}, reuse)
    w.add_(1.0)  # training goes on: the pack keeps the saved values
    assert torch.equal(first["pack:float32"], torch.ones(6))
    _, second = dcp.pack({"w": w}, reuse)
    assert second["pack:float32"].data_ptr() == first["pack:float32"].data_ptr()  # same buffer
    assert torch.equal(second["pack:float32"], torch.full((6,), 2.0))
    _, third = dcp.pack({"w": torch.ones(7)}, reuse)  # another size: a new buffer
    assert third["pack:float32"].numel() == 7 and reuse["pack:float32"] is third["pack:float32"]


def test_a_checkpoint_of_one_entry_per_tensor_is_still_read(tmp_path: Path) -> None:
    """The layout before packing (``{"t": key}``, one DCP entry per tensor) loads as before."""
    folder = str(tmp_path / "old")
    tensors = {"0:/model/w": torch.arange(4.0), "1:/rng": torch.get_rng_state()}
    tree = {"d": [["model", {"d": [["w", {"t": "0:/model/w"}]]}], ["rng", {"t": "1:/rng"}]]}
    os.makedirs(folder)
    Path(folder, dcp.STATE_FILE).write_text(json.dumps({"format": "x", "state": tree}))
    dcp_api.save(tensors, checkpoint_id=folder, no_dist=True)
    _, back = dcp.read(folder)
    assert torch.equal(back["model"]["w"], torch.arange(4.0))
    assert torch.equal(back["rng"], tensors["1:/rng"])
