"""L0: one process's state as a torch.distributed.checkpoint (DCP) folder, read without pickle.

A state (nested dicts, lists and tuples of tensors and plain values, as the
trainer's, an optimizer's or a strategy's ``state_dict``) is split in two:

- its tensors, packed into one flat buffer per dtype (keys ``"pack:<dtype>"``; the
  packs are a copy, so a background writer may take its time) and saved with DCP
  (``dcp.save``) into ``FOLDER/.metadata`` and ``FOLDER/__0_0.distcp``. Packing is for
  speed: DCP's cost grows with the number of entries (each is planned, indexed and serialized
  on its own), and a model's state has dozens of small tensors;
- its structure and plain values as JSON (``FOLDER/state.json``), each tensor
  replaced by its place: ``{"p": [pack key, offset, shape]}`` (older checkpoints:
  ``{"t": key}``, a DCP entry of its own, still read).

Tensors that are equal on every worker (a data-parallel replica's parameters and
optimizer state: ``ShapesCheckpoint.replicated_state``) go to packs of their own
(``"shared:<dtype>"``), of which worker j of N writes only its slice j (elements
[L·j/N, L·(j+1)/N)), as DCP's planner writes a replicated tensor once; ``state.json``
says how they are cut (``"shared"``), and a read puts them together from the other
workers' folders of the same step, checking that each is that step's part of that run.

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
import threading
import warnings
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
import torch.utils.serialization.config as serialization_config
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from disttrain.checkpoint import direct
from disttrain.checkpoint.durable import fsync_tree

__all__ = ["STATE_FILE", "Packed", "pack", "read", "write"]

# no_dist is what we mean (each process writes its own folder); DCP warns about it,
# also from the checkpoint writer thread, so a filter rather than a catch_warnings block
warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)

STATE_FILE = "state.json"
_CRC_LOCK = threading.Lock()
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


#: DCP keys of the packs of replicated tensors, of which each worker writes one slice
_SHARED = "shared:"


class _Packer:
    """Collects a state's tensors into one list per pack (dtype, and whether the tensor is one
    of the ``shared`` paths, equal on every worker), each given its offset in the pack."""

    def __init__(self, shared: Collection[str] = ()) -> None:
        self.shared = tuple(shared)
        self.parts: dict[str, list[torch.Tensor]] = {}
        self.lengths: dict[str, int] = {}

    def _is_shared(self, path: str) -> bool:
        return any(path == s or path.startswith(s + "/") for s in self.shared)

    def add(self, tensor: torch.Tensor, path: str) -> dict[str, Any]:
        flat = tensor.detach().reshape(-1)
        key = _pack_key(flat.dtype, self._is_shared(path))
        offset = self.lengths.get(key, 0)
        self.parts.setdefault(key, []).append(flat)
        self.lengths[key] = offset + flat.numel()
        return {"p": [key, offset, list(tensor.shape)]}

    def packs(
        self, reuse: dict[str, torch.Tensor] | None, share: tuple[int, int]
    ) -> dict[str, torch.Tensor]:
        """One tensor per pack, a copy of the state; of a shared pack only this worker's
        slice (``share``: this worker's index, the number of workers). ``reuse``: buffers
        of earlier packs, filled again where the length is the same (and updated): a fresh
        tensor of the state's size costs its page faults again at every save."""
        out: dict[str, torch.Tensor] = {}
        for key, parts in self.parts.items():
            length = self.lengths[key]
            lo, hi = _slice(length, *share) if key.startswith(_SHARED) else (0, length)
            buf = reuse.get(key) if reuse is not None else None
            if buf is None or buf.numel() != hi - lo:
                buf = torch.empty(hi - lo, dtype=parts[0].dtype)
            at = 0  # where each part starts in the pack: copy what falls in [lo, hi)
            for flat in parts:
                a, b = max(at, lo), min(at + flat.numel(), hi)
                if b > a:
                    buf[a - lo : b - lo].copy_(flat[a - at : b - at])
                at += flat.numel()
            out[key] = buf
        if reuse is not None:
            reuse.clear()
            reuse.update(out)
        return out

    def shared_header(self, share: tuple[int, int]) -> dict[str, Any]:
        """What a reader needs to put the shared packs together ({} when there are none)."""
        lengths = {k: n for k, n in self.lengths.items() if k.startswith(_SHARED)}
        return {"index": share[0], "parts": share[1], "lengths": lengths} if lengths else {}


def _pack_key(dtype: torch.dtype, shared: bool = False) -> str:
    return f"{_SHARED if shared else 'pack:'}{str(dtype).removeprefix('torch.')}"


def _slice(length: int, index: int, parts: int) -> tuple[int, int]:
    """Worker ``index``'s slice of a shared pack of ``length`` elements among ``parts``."""
    return length * index // parts, length * (index + 1) // parts


def _encode(value: Any, path: str, packer: _Packer) -> Any:
    """``value`` as JSON, its tensors handed to ``packer`` (which says where each lies)."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            value = value.cpu()
        return packer.add(value, path)
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


@dataclass
class Packed:
    """A state ready to write: its JSON tree, its packs, how its shared packs are cut."""

    tree: Any
    tensors: dict[str, torch.Tensor]
    shared: dict[str, Any]


def pack(
    state: dict[str, Any],
    reuse: dict[str, torch.Tensor] | None = None,
    shared: Collection[str] = (),
    share: tuple[int, int] = (0, 1),
) -> Packed:
    """``state`` as a private copy that :func:`write` may write while training changes the
    state (``reuse``: see :meth:`_Packer.packs`; the caller makes sure no write still reads
    them). ``shared``: the paths (``/model/0.weight``, ``/optimizer``: a tensor at or under
    one) that are equal on every worker; of those this worker keeps only its slice,
    ``share`` = (its index, the number of workers), and :func:`read` puts them together
    from every worker's folder: each replicated byte is written once over all workers."""
    packer = _Packer(shared)
    tree = _encode(state, "", packer)
    return Packed(tree, packer.packs(reuse, share), packer.shared_header(share))


def write(folder: str, header: dict[str, Any], packed: Packed) -> None:
    """Write a :func:`pack`'ed state into ``folder`` with DCP's writer (its files around the
    page cache: :mod:`~disttrain.checkpoint.direct`), every file fsync'ed."""
    os.makedirs(folder, exist_ok=True)
    doc = {**header, "state": packed.tree}
    if packed.shared:
        doc["shared"] = packed.shared
    tmp = os.path.join(folder, f"{STATE_FILE}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(json.dumps(doc).encode())
    os.replace(tmp, os.path.join(folder, STATE_FILE))
    # without torch.save's zip CRC-32 over every byte: torch.load never checks it, and its
    # CPU time is taken from the training where every core trains. The
    # setting is process-wide while it lasts (another thread's torch.save then skips it
    # too, harmless for the same reason); the lock keeps two writes from restoring it
    # out of order
    # (patch: added to the module at import by torch's install_config_module)
    with _CRC_LOCK, serialization_config.patch({"save.compute_crc32": False}):  # type: ignore[attr-defined]
        dcp.save(packed.tensors, storage_writer=direct.writer(folder), no_dist=True)
    fsync_tree(folder)


def _load(folder: str, keys: Collection[str] | None = None) -> dict[str, torch.Tensor]:
    """The DCP entries of ``folder`` (all, or ``keys``), shaped as its index says."""
    reader = _SafeReader(folder)
    metadata = reader.read_metadata()
    # the tensors to fill, shaped as the index says (DCP loads into given tensors)
    tensors: dict[str, torch.Tensor] = {}
    for key, meta in metadata.state_dict_metadata.items():
        if keys is not None and key not in keys:
            continue
        size, dtype = (
            getattr(meta, "size", None),
            getattr(getattr(meta, "properties", None), "dtype", None),
        )
        if size is None or dtype is None:
            raise ValueError(f"entry {key!r} is not a tensor")
        tensors[key] = torch.empty(size, dtype=dtype)
    if keys is not None and set(keys) - set(tensors):
        raise ValueError(f"{folder} holds no {sorted(set(keys) - set(tensors))[0]!r}")
    try:
        dcp.load(tensors, storage_reader=reader, no_dist=True)
    except CheckpointException as exc:  # a BaseException wrapping the reader's own error
        inner = [f[0] if isinstance(f, tuple) else f for f in exc.failures.values()]
        raise ValueError(str(inner[0]) if inner else "unreadable DCP data") from None
    return tensors


def _header(folder: str) -> dict[str, Any]:
    with open(os.path.join(folder, STATE_FILE), "rb") as fh:
        doc = json.loads(fh.read())
    if not isinstance(doc, dict) or "state" not in doc:
        raise ValueError(f"no state in {STATE_FILE}")
    return doc


def _join_shared(
    doc: dict[str, Any], tensors: dict[str, torch.Tensor], sibling: Callable[[int], str] | None
) -> None:
    """Replace this part's slices of the shared packs by the whole packs, the other slices
    read from the other workers' parts of the same step and run (``sibling(j)``: worker j's)."""
    shared = doc["shared"]
    index, parts, lengths = int(shared["index"]), int(shared["parts"]), shared["lengths"]
    if sibling is None:
        raise ValueError("its replicated state is spread over every worker's part")
    slices: list[dict[str, torch.Tensor]] = []  # worker j's slice of every shared pack
    for j in range(parts):
        if j == index:
            slices.append({key: tensors[key] for key in lengths})
            continue
        other = _header(sibling(j))
        if (other.get("run"), other.get("step"), other.get("shared")) != (
            doc.get("run"),
            doc.get("step"),
            {**shared, "index": j},
        ):
            raise ValueError(f"{sibling(j)} is not this step's part {j}")
        slices.append(_load(sibling(j), list(lengths)))
    for key, length in lengths.items():
        pieces = [got[key] for got in slices]
        for j, got in enumerate(pieces):
            lo, hi = _slice(int(length), j, parts)
            if got.numel() != hi - lo:
                raise ValueError(f"part {j}'s slice of {key!r} has {got.numel()} elements")
        tensors[key] = torch.cat(pieces)


def read(
    folder: str, sibling: Callable[[int], str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(header, state) of ``folder``; ValueError (or an unpickling error) if it is not ours.

    ``sibling(j)``: the folder of worker j's part of the same step, where the state has
    shared (replicated) tensors, each worker holding a slice of them."""
    doc = _header(folder)
    tensors = _load(folder)
    if doc.get("shared"):
        _join_shared(doc, tensors, sibling)
        doc.pop("shared")
    state = _decode(doc.pop("state"), tensors)
    return doc, state
