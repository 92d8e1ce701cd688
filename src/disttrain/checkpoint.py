"""L0: checkpoints that survive a crash mid-save, and are refused if they are not ours.

Layout under ``DIR/checkpoints/``::

    step-00000100/rank-00000.pt   each rank's own state (replicas, shards, residuals, RNG)
    step-00000100/COMMIT          written last, by rank 0, after every rank has saved

Each file is written to a temporary name, fsync'ed and renamed; the COMMIT
marker makes a step's checkpoint visible only once all ranks' files exist, so a
crash during a save leaves the previous checkpoint the latest usable one.
Loading uses ``torch.load(weights_only=True)``: only tensors and plain
containers, never arbitrary objects, and the file must carry our format tag.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any

import torch

from disttrain.comm.errors import UsageError

__all__ = ["FORMAT", "commit", "latest", "load", "resume_source", "save"]

FORMAT = "disttrain-checkpoint-v1"
_STEP = re.compile(r"^step-(\d{8})$")


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: str, obj: Any) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as fh:
        torch.save(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path))


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, "checkpoints", f"step-{step:08d}")


def save(root: str, step: int, rank: int, world_size: int, state: dict[str, Any]) -> str:
    """Write this rank's ``state`` for ``step``; the caller commits after a barrier."""
    folder = step_dir(root, step)
    os.makedirs(folder, exist_ok=True)
    payload = {"format": FORMAT, "step": step, "rank": rank, "world_size": world_size, **state}
    path = os.path.join(folder, f"rank-{rank:05d}.pt")
    _write_atomic(path, payload)
    return path


def commit(root: str, step: int, keep: int = 2) -> None:
    """Mark ``step`` complete (rank 0, after all ranks saved) and drop older checkpoints."""
    folder = step_dir(root, step)
    marker = os.path.join(folder, "COMMIT")
    with open(marker + ".tmp", "w") as fh:
        fh.write(f"{step}\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(marker + ".tmp", marker)
    _fsync_dir(folder)
    for old in _committed(root)[:-keep]:
        shutil.rmtree(step_dir(root, old), ignore_errors=True)


def _committed(root: str) -> list[int]:
    base = os.path.join(root, "checkpoints")
    if not os.path.isdir(base):
        return []
    steps = []
    for name in os.listdir(base):
        m = _STEP.match(name)
        if m and os.path.exists(os.path.join(base, name, "COMMIT")):
            steps.append(int(m.group(1)))
    return sorted(steps)


def latest(root: str) -> int | None:
    """The newest committed step under ``root`` (a run's --out folder), or None."""
    steps = _committed(root)
    return steps[-1] if steps else None


def _reason(exc: BaseException) -> str:
    """One line out of torch.load's multi-line refusal: the rule the file broke."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if lines and lines[0].startswith("Weights only load failed"):
        # torch's advice comes first; the line naming the refused global or opcode follows
        advice = ("Check the documentation", "Please file an issue")
        details = [x for x in lines[1:] if not x.startswith(advice)]
        return f"refused by weights_only: {details[0] if details else '?'}"
    text = lines[0] if lines else type(exc).__name__
    return text.split(". This is")[0]  # miniz's advice after a truncated file


def load(root: str, rank: int, world_size: int, step: int | None = None) -> dict[str, Any]:
    """This rank's state from the newest (or the given) committed checkpoint under ``root``."""
    if not os.path.isdir(root):
        raise UsageError(f"--resume {root}: no such folder")
    step = latest(root) if step is None else step
    if step is None:
        raise UsageError(f"--resume {root}: no complete checkpoint in {root}/checkpoints")
    path = os.path.join(step_dir(root, step), f"rank-{rank:05d}.pt")
    if not os.path.exists(path):
        raise UsageError(f"--resume {root}: step {step} has no state for rank {rank}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # unpickling refused, truncated or foreign file
        raise UsageError(
            f"--resume: {path} is not a disttrain checkpoint ({_reason(exc)})"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UsageError(f"--resume: {path} is not a disttrain checkpoint (no {FORMAT} tag)")
    if state["world_size"] != world_size:
        raise UsageError(
            f"--resume: the checkpoint was written by {state['world_size']} workers, this run "
            f"has {world_size}; resume with --workers {state['world_size']}"
        )
    return state


def resume_source(resume: str, out: str) -> str:
    """Where to restore from: ``--resume``, or after an elastic restart one's own ``--out``.

    Empty when it starts afresh. Shared by workers (the trainer) and by
    parameter servers, which restore their shards and optimizer themselves.
    """
    if resume:
        return resume
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    if restarted and out and latest(out) is not None:
        return out
    return ""
