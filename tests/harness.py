"""The multi-process test harness: N ranks on a private file store, with a hard timeout.

    results = run_world(fn, world_size=3, args=(...), timeout=60)

``fn(*args)`` runs on every rank after ``disttrain.comm.init()``; its return
values come back as a list indexed by rank (tensors inside dicts, lists and
tuples travel as numpy copies: torch's shared-memory handles would vanish with
the process that made them). An exception on any rank is
re-raised here naming the rank; a rank still running at the timeout is killed
with all the others and the test fails with :class:`WorldTimeout` instead of
hanging.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["RankError", "WorldTimeout", "run_world"]

_CTX = mp.get_context("spawn")


class RankError(AssertionError):
    """A rank raised; the message holds its rank and traceback."""


class WorldTimeout(AssertionError):
    """The ranks did not all finish in time."""


class _Array:
    """A tensor in transit: its numpy copy."""

    def __init__(self, array: Any) -> None:
        self.array = array


def _pack(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return _Array(value.detach().cpu().clone().numpy())
    if isinstance(value, dict):
        return {k: _pack(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_pack(v) for v in value)
    return value


def _unpack(value: Any) -> Any:
    import torch

    if isinstance(value, _Array):
        return torch.from_numpy(value.array)
    if isinstance(value, dict):
        return {k: _unpack(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_unpack(v) for v in value)
    return value


def _entry(
    rank: int,
    world_size: int,
    store: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    results: Any,
    collective_timeout: float,
    env: dict[str, str],
) -> None:
    os.environ.update(env)
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "DISTTRAIN_STORE_FILE": store,
        }
    )
    try:
        from disttrain.comm import world

        world.init(timeout=collective_timeout)
        value = fn(*args)
        results.put((rank, True, _pack(value)))
    except BaseException as exc:  # report everything, KeyboardInterrupt included
        results.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        try:
            from disttrain.comm import world

            world.shutdown()
        except Exception:
            pass


def run_world(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple[Any, ...] = (),
    timeout: float = 90.0,
    collective_timeout: float = 30.0,
    env: dict[str, str] | None = None,
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` ranks; return the per-rank results."""
    fd, store = tempfile.mkstemp(prefix="disttrain-test-store-")
    os.close(fd)
    os.unlink(store)  # FileStore creates it; a stale file would confuse it
    results = _CTX.Queue()
    procs = [
        _CTX.Process(
            target=_entry,
            args=(r, world_size, store, fn, args, results, collective_timeout, env or {}),
            daemon=True,
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    errors: list[str] = []
    reported: set[int] = set()
    try:
        deadline = time.monotonic() + timeout
        while len(reported) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(world_size)) - set(out))
                raise WorldTimeout(f"ranks {missing} still running after {timeout:.0f} s")
            try:
                rank, ok, value = results.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                for r, p in enumerate(procs):
                    if p.exitcode not in (None, 0) and r not in reported:
                        # Died without reporting (killed, or crashed in C++).
                        reported.add(r)
                        errors.append(f"rank {r} died with exit code {p.exitcode}")
                continue
            reported.add(rank)
            if ok:
                out[rank] = _unpack(value)
            else:
                errors.append(f"rank {rank}: {value}")
        if errors:
            raise RankError("\n".join(errors))
        return [out[r] for r in range(world_size)]
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        for path in (store, f"{store}.0"):  # world.init adds the restart round
            if os.path.exists(path):
                os.unlink(path)
