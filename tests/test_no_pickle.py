"""Nothing on any wire of ours is unpickled: a scan of src/ for every way to (un)pickle.

The scan parses each module (``ast``), so comments and docstrings do not count
and aliases (``import pickle as p``) do. Forbidden: importing pickle, dill,
cloudpickle, marshal or shelve; calling any ``*_object`` / ``*_object_list``
collective of torch.distributed; ZeroMQ's ``send_pyobj``/``recv_pyobj``;
``torch.load`` without ``weights_only=True``; ``np.load`` with
``allow_pickle=True``; multiprocessing queues and pipes (they pickle). Each
allowed exception is listed in ALLOWED with the reason it is not a wire, or, for
the Horovod drop-in's ``*_object`` calls, the compatible API that promises it.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "disttrain"

PICKLING_MODULES = {"pickle", "_pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve"}
OBJECT_COLLECTIVES = {
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
    "send_pyobj",
    "recv_pyobj",
}
MP_PICKLERS = {"Queue", "SimpleQueue", "JoinableQueue", "Pipe", "Manager"}

#: (file relative to src/disttrain, rule) -> why it is not a wire of ours.
ALLOWED: dict[tuple[str, str], str] = {
    ("launch/spawn.py", "multiprocessing Queue"): (
        "the local runner of tests and benchmarks: its parent collects its own spawned "
        "children's results over an OS pipe on one host; no socket, and only the parent reads it"
    ),
    ("horovod/functions.py", "import pickle"): (
        "Horovod's broadcast_object and allgather_object, whose API promises to pickle "
        "arbitrary objects (docs/horovod.md says so, and that the ranks must trust each "
        "other, as under Horovod); nothing else in disttrain.horovod pickles (hvd.elastic's "
        "TorchState syncs its plain values through these two calls, as Horovod's does, and "
        "under torchrun --max-restarts keeps them, pickled the same way by object_bytes, in "
        "torchrun's store for a restarted round of the same job)"
    ),
    ("checkpoint/dcp.py", "import pickle"): (
        "torch.distributed.checkpoint writes its .metadata index with pickle; we read it from "
        "our own committed checkpoint folder on disk (never a wire) with an Unpickler whose "
        "find_class admits only DCP's metadata classes, torch.Size and dtypes"
    ),
}


def _is_true(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def violations(source: str) -> list[tuple[int, str]]:
    """(line, rule) for every way ``source`` could unpickle."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PICKLING_MODULES:
                    found.append((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in PICKLING_MODULES:
                found.append((node.lineno, f"import {node.module}"))
            for alias in node.names:
                if alias.name in OBJECT_COLLECTIVES:
                    found.append((node.lineno, alias.name))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            owner = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
            kwargs = {k.arg: k.value for k in node.keywords}
            if name in OBJECT_COLLECTIVES:
                found.append((node.lineno, name))
            elif name == "load" and owner == "torch":
                if not ("weights_only" in kwargs and _is_true(kwargs["weights_only"])):
                    found.append((node.lineno, "torch.load without weights_only=True"))
            elif name == "load" and owner in ("np", "numpy"):
                if "allow_pickle" in kwargs and not (
                    isinstance(kwargs["allow_pickle"], ast.Constant)
                    and kwargs["allow_pickle"].value is False
                ):
                    found.append((node.lineno, "np.load with allow_pickle"))
            elif name in MP_PICKLERS and (
                "mp" in owner or "multiprocessing" in owner or owner in ("ctx",)
            ):
                found.append((node.lineno, f"multiprocessing {name}"))
    return sorted(found)


def test_the_scanner_finds_every_kind_it_forbids() -> None:
    """The check can fail: each forbidden form in a snippet is found."""
    snippet = """
import pickle
import cloudpickle as cp
from dill import loads
from torch.distributed import all_gather_object
import torch, numpy as np, multiprocessing as mp
dist.broadcast_object_list(objs, src=0)
dist.recv_object_list(objs)
sock.recv_pyobj()
torch.load(path)
torch.load(path, weights_only=False)
np.load(path, allow_pickle=True)
q = mp.get_context("spawn").Queue()
# pickle.loads(x) in a comment does not count
torch.load(path, weights_only=True)
np.load(path, allow_pickle=False)
"""
    rules = [rule for _, rule in violations(snippet)]
    assert rules == [
        "import pickle",
        "import cloudpickle",
        "import dill",
        "all_gather_object",
        "broadcast_object_list",
        "recv_object_list",
        "recv_pyobj",
        "torch.load without weights_only=True",
        "torch.load without weights_only=True",
        "np.load with allow_pickle",
        "multiprocessing Queue",
    ], rules


def test_nothing_in_src_unpickles() -> None:
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 50, "the scan found too few modules: is SRC right?"
    bad, used = [], set()
    for path in files:
        rel = path.relative_to(SRC).as_posix()
        for line, rule in violations(path.read_text()):
            if (rel, rule) in ALLOWED:
                used.add((rel, rule))
            else:
                bad.append(f"{rel}:{line}: {rule}")
    assert not bad, "pickling in src/ (a wire must carry raw bytes):\n" + "\n".join(bad)
    assert used == set(ALLOWED), f"stale ALLOWED entries: {set(ALLOWED) - used}"
