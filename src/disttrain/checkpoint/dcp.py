"""L0: one process's state as a torch.distributed.checkpoint (DCP) folder, read without pickle.

A state (nested dicts, lists and tuples of tensors and plain values, as the
trainer's, an optimizer's or a strategy's ``state_dict``) is split in two:

- its tensors, packed into one flat buffer per dtype (keys ``"pack:<dtype>"``; the
  packs are a copy, so a background writer may take its time) and saved with DCP
  (``dcp.save``) into ``FOLDER/.metadata`` and ``FOLDER/__0_0.distcp``. Packing is for speed: DCP's
  cost grows with the number of entries (each is planned, indexed and serialized
  on its own), and a model's state has dozens of small tensors: a save of the cnn's
  state with momentum (17 tensors, 1.2 MB) took 5.1 ms unpacked and 3.1 ms packed here;
- its structure and plain values as JSON (``FOLDER/state.json``), each tensor
  replaced by its place: ``{"p": [pack key, offset, shape]}`` (older checkpoints:
  ``{"t": key}``, a DCP entry of its own, still read).

Nothing is unpickled on load: DCP reads tensor data with ``torch.load(weights_only=True)``,
the ``.metadata`` index (which DCP pickles) goes through :class:`_SafeUnpickler`, which
admits only DCP's own metadata classes, ``torch.Size`` and dtypes, and the rest is
JSON. Each process writes its own folder (``no_dist``): parameter servers save inside
their serving loop while workers save between steps, so no collective save could
bring them together, and a resume on another number of workers reads the folders of
the old ranks it needs (docs/reliability.md, "Resuming on another number of workers").
"""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import warnings
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from disttrain.checkpoint.durable import fsync_tree

__all__ = ["STATE_FILE", "pack", "read", "write"]

# no_dist is what we mean (each process writes its own folder); DCP warns about it,
# also from the checkpoint writer thread, so a filter rather than a catch_warnings block
warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)

STATE_FILE = "state.json"
#: The only globals a DCP ``.metadata`` file may name (what torch 2.x writes there).
_ALLOWED_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
)
_ALLOWED = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath")}


class _SafeUnpickler(pickle.Unpickler):
    """Unpickle DCP's metadata index only: any other global is refused (no code runs)."""

    def find_class(self, module: str, name: str) -> Any:
        if module in _ALLOWED_MODULES or (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"refused global {module}.{name} in a DCP metadata file")


class _SafeReader(FileSystemReader):
    """DCP's file reader with its ``.metadata`` read by :class:`_SafeUnpickler`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        del args, kwargs
        with open(os.path.join(str(self.path), ".metadata"), "rb") as fh:
            metadata = _SafeUnpickler(io.BytesIO(fh.read())).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError("the DCP metadata file holds no Metadata")
        meta = metadata.storage_meta or StorageMeta()
        meta.load_id = self.load_id
        metadata.storage_meta = meta
        return metadata


class _Packer:
    """Collects a state's tensors into one list per dtype, each given its offset in the pack."""

    def __init__(self) -> None:
        self.parts: dict[torch.dtype, list[torch.Tensor]] = {}
        self.lengths: dict[torch.dtype, int] = {}

    def add(self, tensor: torch.Tensor) -> dict[str, Any]:
        flat = tensor.detach().reshape(-1)
        offset = self.lengths.get(flat.dtype, 0)
        self.parts.setdefault(flat.dtype, []).append(flat)
        self.lengths[flat.dtype] = offset + flat.numel()
        return {"p": [_pack_key(flat.dtype), offset, list(tensor.shape)]}

    def packs(self, reuse: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """One tensor per dtype, a copy of the state. ``reuse``: buffers of earlier packs,
        filled again where the length is the same (and updated): a fresh 25 MB tensor
        costs its page faults again at every save, ~40 % of the copy's time here."""
        out: dict[str, torch.Tensor] = {}
        for dtype, parts in self.parts.items():
            key, length = _pack_key(dtype), self.lengths[dtype]
            buf = reuse.get(key) if reuse is not None else None
            if buf is None or buf.numel() != length:
                buf = torch.empty(length, dtype=dtype)
            out[key] = torch.cat(parts, out=buf)
        if reuse is not None:
            reuse.clear()
            reuse.update(out)
        return out


def _pack_key(dtype: torch.dtype) -> str:
    return f"pack:{str(dtype).removeprefix('torch.')}"


def _encode(value: Any, path: str, packer: _Packer) -> Any:
    """``value`` as JSON, its tensors handed to ``packer`` (which says where each lies)."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            value = value.cpu()
        return packer.add(value)
    if isinstance(value, dict):
        if not all(isinstance(k, (str, int)) for k in value):
            raise TypeError(f"checkpoint state {path!r}: dict keys must be str or int")
        return {"d": [[k, _encode(v, f"{path}/{k}", packer)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        items = [_encode(v, f"{path}/{i}", packer) for i, v in enumerate(value)]
        return {"u" if isinstance(value, tuple) else "l": items}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"v": value}
    raise TypeError(f"checkpoint state {path!r}: cannot store a {type(value).__name__}")


def _decode(node: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if not isinstance(node, dict) or len(node) != 1:
        raise ValueError("malformed state.json")
    kind, body = next(iter(node.items()))
    if kind == "p":
        key, offset, shape = body
        count = math.prod(shape)
        return tensors[key][offset : offset + count].view(shape).clone()  # its own storage
    if kind == "t":
        return tensors[body]
    if kind == "d":
        return {k: _decode(v, tensors) for k, v in body}
    if kind in ("l", "u"):
        items = [_decode(v, tensors) for v in body]
        return tuple(items) if kind == "u" else items
    if kind == "v":
        return body
    raise ValueError(f"malformed state.json (kind {kind!r})")


def pack(state: dict[str, Any], reuse: dict[str, torch.Tensor] | None = None
         ) -> tuple[Any, dict[str, torch.Tensor]]:  # fmt: skip
    """``state`` as (its JSON tree, its packs): the packs are a private copy that
    :func:`write` may write while training changes the state (``reuse``: see
    :meth:`_Packer.packs`; the caller makes sure no write still reads them)."""
    packer = _Packer()
    tree = _encode(state, "", packer)
    return tree, packer.packs(reuse)


def write(folder: str, header: dict[str, Any], packed: tuple[Any, dict[str, torch.Tensor]]
          ) -> None:  # fmt: skip
    """Write a :func:`pack`'ed state into ``folder`` with DCP's writer, every file fsync'ed."""
    tree, tensors = packed
    os.makedirs(folder, exist_ok=True)
    text = json.dumps({**header, "state": tree}).encode()
    tmp = os.path.join(folder, f"{STATE_FILE}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(text)
    os.replace(tmp, os.path.join(folder, STATE_FILE))
    dcp.save(tensors, checkpoint_id=folder, no_dist=True)
    fsync_tree(folder)


def read(folder: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(header, state) of ``folder``; ValueError (or an unpickling error) if it is not ours."""
    with open(os.path.join(folder, STATE_FILE), "rb") as fh:
        doc = json.loads(fh.read())
    if not isinstance(doc, dict) or "state" not in doc:
        raise ValueError(f"no state in {STATE_FILE}")
    reader = _SafeReader(folder)
    metadata = reader.read_metadata()
    # the tensors to fill, shaped as the index says (DCP loads into given tensors)
    tensors: dict[str, torch.Tensor] = {}
    for key, meta in metadata.state_dict_metadata.items():
        size, dtype = (
            getattr(meta, "size", None),
            getattr(getattr(meta, "properties", None), "dtype", None),
        )
        if size is None or dtype is None:
            raise ValueError(f"entry {key!r} is not a tensor")
        tensors[key] = torch.empty(size, dtype=dtype)
    try:
        dcp.load(tensors, storage_reader=reader, no_dist=True)
    except CheckpointException as exc:  # a BaseException wrapping the reader's own error
        inner = [f[0] if isinstance(f, tuple) else f for f in exc.failures.values()]
        raise ValueError(str(inner[0]) if inner else "unreadable DCP data") from None
    state = _decode(doc.pop("state"), tensors)
    return doc, state
