"""L0: one process's state as a torch.distributed.checkpoint (DCP) folder, read without pickle.

A state (nested dicts, lists and tuples of tensors and plain values, as the
trainer's, an optimizer's or a strategy's ``state_dict``) is split in two:

- its tensors, saved with DCP (``dcp.save``, or ``dcp.async_save``, which copies
  them to CPU memory before it returns and writes them in a background thread)
  under flat keys ``"<index>:<path>"`` into ``FOLDER/.metadata`` and
  ``FOLDER/__0_0.distcp``;
- its structure and plain values as JSON (``FOLDER/state.json``), each tensor
  replaced by its DCP key.

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
import os
import pickle
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from disttrain.checkpoint.durable import fsync_tree

__all__ = ["STATE_FILE", "read", "write"]

# no_dist is what we mean (each process writes its own folder); DCP warns about it,
# also from async_save's thread, so a filter rather than a catch_warnings block
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


def _encode(value: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    """``value`` as JSON, its tensors moved into ``tensors`` under fresh keys."""
    if isinstance(value, torch.Tensor):
        key = f"{len(tensors)}:{path}"
        tensors[key] = value.detach()
        return {"t": key}
    if isinstance(value, dict):
        if not all(isinstance(k, (str, int)) for k in value):
            raise TypeError(f"checkpoint state {path!r}: dict keys must be str or int")
        return {"d": [[k, _encode(v, f"{path}/{k}", tensors)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        items = [_encode(v, f"{path}/{i}", tensors) for i, v in enumerate(value)]
        return {"u" if isinstance(value, tuple) else "l": items}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"v": value}
    raise TypeError(f"checkpoint state {path!r}: cannot store a {type(value).__name__}")


def _decode(node: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if not isinstance(node, dict) or len(node) != 1:
        raise ValueError("malformed state.json")
    kind, body = next(iter(node.items()))
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


def write(folder: str, header: dict[str, Any], state: dict[str, Any], background: bool = False
          ) -> Callable[[], None]:  # fmt: skip
    """Write ``state`` into ``folder``; return a function that waits until it is on disk.

    ``background``: DCP's ``async_save`` copies the tensors now and writes them in a
    thread; the returned function then waits for that write (the caller commits only
    after it). Otherwise the write is done when this returns.
    """
    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(state, "", tensors)
    os.makedirs(folder, exist_ok=True)
    text = json.dumps({**header, "state": tree}).encode()
    tmp = os.path.join(folder, f"{STATE_FILE}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(text)
    os.replace(tmp, os.path.join(folder, STATE_FILE))
    if not background:
        dcp.save(tensors, checkpoint_id=folder, no_dist=True)
        fsync_tree(folder)
        return lambda: None
    future: Future[Any] = dcp.async_save(tensors, checkpoint_id=folder, no_dist=True)  # type: ignore[assignment]

    def wait() -> None:
        future.result()
        fsync_tree(folder)

    return wait


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
