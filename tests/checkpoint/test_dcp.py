"""checkpoint.dcp: a state packed into one DCP entry per dtype reads back equal, unshared."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp_api

from disttrain.checkpoint import dcp


def _state() -> dict[str, object]:
    g = torch.Generator().manual_seed(0)
    return {
        "model": {
            "w": torch.randn(3, 4, generator=g),
            "b": torch.randn(4, generator=g),
            "empty": torch.zeros(0, 5),
            "scalar": torch.tensor(2.5),
        },
        "optimizer": {
            "state": {
                0: {
                    "step": torch.tensor(7, dtype=torch.int64),
                    "buf": torch.randn(4, 3, generator=g).t(),
                }
            },  # strided
            "param_groups": [{"lr": 0.1, "params": [0]}],
        },
        "rng": torch.get_rng_state(),  # uint8
        "half": torch.randn(5, generator=g).half(),
        "pair": (1, "two", None, True),
    }


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


def test_the_write_skips_torch_saves_crc_and_puts_the_setting_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.utils.serialization.config as config

    seen = []
    real = torch.save

    def spy(*args: object, **kwargs: object) -> None:
        seen.append(config.save.compute_crc32)
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch, "save", spy)
    state = _state()
    dcp.write(str(tmp_path / "part"), {}, dcp.pack(state))
    assert seen and not any(seen)  # DCP's torch.save of each pack ran without the CRC
    assert config.save.compute_crc32  # the process-wide setting is back
    assert _equal(state, dcp.read(str(tmp_path / "part"))[1])


def test_the_packs_are_a_copy_and_reuse_their_buffers_when_the_sizes_match() -> None:
    w = torch.ones(6)
    reuse: dict[str, torch.Tensor] = {}
    first = dcp.pack({"w": w}, reuse).tensors
    w.add_(1.0)  # training goes on: the pack keeps the saved values
    assert torch.equal(first["pack:float32"], torch.ones(6))
    second = dcp.pack({"w": w}, reuse).tensors
    assert second["pack:float32"].data_ptr() == first["pack:float32"].data_ptr()  # same buffer
    assert torch.equal(second["pack:float32"], torch.full((6,), 2.0))
    third = dcp.pack({"w": torch.ones(7)}, reuse).tensors  # another size: a new buffer
    assert third["pack:float32"].numel() == 7 and reuse["pack:float32"] is third["pack:float32"]


def test_replicated_tensors_are_written_once_over_the_workers_and_read_back_whole(
    tmp_path: Path,
) -> None:
    """Three workers with equal parameters and optimizer state, their own buffer and rng:
    each part holds a third of the shared packs, and each reads back its whole state."""
    g = torch.Generator().manual_seed(0)
    shared = {"w": torch.randn(5, 7, generator=g), "b": torch.randn(7, generator=g)}
    momentum = {0: {"momentum_buffer": torch.randn(11, generator=g)}}
    states = [
        {
            "model": {**shared, "running": torch.full((3,), float(j))},
            "optimizer": {"state": momentum, "param_groups": [{"lr": 0.1}]},
            "rng": torch.full((4,), j, dtype=torch.uint8),
        }
        for j in range(3)
    ]
    paths = {"/model/w", "/model/b", "/optimizer"}
    folder = lambda j: str(tmp_path / f"rank-{j}")  # noqa: E731
    for j, state in enumerate(states):
        packed = dcp.pack(state, shared=paths, share=(j, 3))
        # 35 + 7 + 11 shared floats over 3 workers: 17, 18, 18; the buffer stays whole
        assert packed.tensors["shared:float32"].numel() == [17, 18, 18][j]
        assert packed.tensors["pack:float32"].numel() == 3
        dcp.write(folder(j), {"run": "r", "step": 4}, packed)
    for j, state in enumerate(states):
        header, back = dcp.read(folder(j), folder)
        assert header == {"run": "r", "step": 4} and _equal(state, back)
    # without its siblings, or with a sibling of another step, a part is refused
    with pytest.raises(ValueError, match="spread over every worker's part"):
        dcp.read(folder(0))
    other = json.loads(Path(folder(2), dcp.STATE_FILE).read_text())
    Path(folder(2), dcp.STATE_FILE).write_text(json.dumps({**other, "step": 5}))
    with pytest.raises(ValueError, match="is not this step's part 2"):
        dcp.read(folder(0), folder)


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
