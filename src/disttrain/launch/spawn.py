"""N local ranks on a private file store, with a hard timeout: the tests' and benchmarks' runner.

    results = run_world(fn, world_size=3, args=(...), timeout=60)

Each rank is a fresh process forked by multiprocessing's ``forkserver``: a
server that imported torch and disttrain once, before any tensor work (so no
thread pool or process group is inherited), forks each rank on request. A rank
thus starts in milliseconds instead of the ~1.1 s of CPU that a ``spawn``
process spends importing torch; the tests start hundreds. Each rank gets the
caller's environment as it is at the call, with ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE`` and the store variable (:data:`~disttrain.comm.world.STORE_FILE_ENV`)
set, and runs
``fn(*args)`` after :func:`disttrain.comm.init`; the return values come back as
a list indexed by rank. Tensors inside dicts, lists and tuples travel as numpy
copies: torch's shared-memory handles would vanish with the process that made
them. ``fn`` and ``args`` must be picklable (``fn`` a module-level function).

Failures name the rank:
- a rank that raised: :class:`RankError` with its exception and traceback text;
  the other ranks get ``grace`` seconds to finish or fail (their errors are
  listed too, in the order they came: first one line each, then the tracebacks),
  then are killed;
- a rank that died without a result (killed, ``os._exit``, a crash in C++):
  :class:`RankError` with its exit code, or the signal that ended it;
- ranks still running at ``timeout``: every rank is killed, and
  :class:`WorldTimeout` names those that had not finished.

This is not the job launcher (:mod:`disttrain.launch.local`, with torch's
elastic agent): it has no restarts, no roll call and no rendezvous beyond one
file store in a temporary folder of its own.
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing as mp
import os
import queue
import shutil
import signal
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from typing import Any

import torch

from disttrain import lean
from disttrain.collectives.shmseg import JOB_ENV, remove_leftovers
from disttrain.comm import world
from disttrain.comm.world import STORE_FILE_ENV
from disttrain.launch import jobdir, malloc, startup
from disttrain.registry import load_plugins

__all__ = ["RankError", "WorldTimeout", "run_world"]


class RankError(RuntimeError):
    """A rank raised or died; the message names it (with its traceback or exit code)."""


def _report(errors: list[str]) -> str:
    """Each failure's first line, in the order they came, then the tracebacks: a report
    cut short (CI keeps the head and the tail) still names every rank and how it ended."""
    heads = [e.splitlines()[0] for e in errors]
    details = [e for e in errors if "\n" in e.strip()]
    return "\n".join(heads) + ("\n\n" + "\n".join(details) if details else "")


class WorldTimeout(RuntimeError):
    """The ranks did not all finish in time; the message names those still running."""


class _Array:
    """A tensor in transit: its numpy copy."""

    def __init__(self, array: Any) -> None:
        self.array = array


def _pack(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _Array(value.detach().cpu().clone().numpy())
    if isinstance(value, dict):
        return {k: _pack(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(_pack(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_pack(v) for v in value)
    return value


def _unpack(value: Any) -> Any:
    if isinstance(value, _Array):
        return torch.from_numpy(value.array)
    if isinstance(value, dict):
        return {k: _unpack(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_unpack(v) for v in value))
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
    # a rank that dies in C++ (gloo's abort, a segfault) prints every thread's Python stack
    faulthandler.enable()
    os.environ.clear()  # the caller's environment at the call, not the fork server's
    os.environ.update(env)
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size),
            "WORLD_SIZE": str(world_size),
            STORE_FILE_ENV: store,
        }
    )
    try:
        startup.freeze()  # the fork server's imports: never walked by this rank's collector
        lean.apply()  # as our workers: no torch._dynamo unless something compiles
        malloc.keep_freed_buffers()  # as our workers: freed model-sized buffers reused
        load_plugins()  # a spawned rank starts afresh: the plug-ins' algorithms too
        # gloo failing to connect the ranks is tried again inside, all ranks together
        world.init(timeout=collective_timeout)
        value = fn(*args)
        results.put((rank, True, _pack(value)))
    except BaseException as exc:  # report everything, KeyboardInterrupt and SystemExit included
        results.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        # The result reaches the parent before anything is torn down, and the process ends
        # without the interpreter's finalization. Both for torch's gloo teardown, which
        # now and then aborts the process ("terminate called without an active exception",
        # SIGABRT: seen in a CI run and a calibration, with no Python frame on the stack):
        # a gloo thread that releases the last reference to a tensor during finalization
        # must take the GIL, and Python ends such a thread in a way C++ cannot unwind
        # (pytorch/pytorch#190489, #179291). The parent then got no result and named the
        # rank as dead although its work was done.
        results.close()
        results.join_thread()  # the queue's feeder thread has written the result
        # a group broken by a failed peer may fail to close; the result is already sent
        with contextlib.suppress(Exception):
            world.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # whatever the rank's outcome: the parent reads it from the result


#: imported once by the fork server, before it forks any rank: torch (the ~1.1 s a rank
#: would spend), and the layers most ranks' functions use. Nothing here runs tensor work:
#: a thread pool started in the server would not survive the fork.
_PRELOAD = ["torch", "torch.distributed", "disttrain.comm.world", "disttrain.launch.spawn"]


def _context() -> Any:
    """multiprocessing's ``forkserver`` context, with :data:`_PRELOAD` set (it takes effect
    when the server starts: on the first call in this process)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _how_it_ended(exitcode: int) -> str:
    """``exit code 7``, or ``signal SIGKILL`` for a negative exit code (multiprocessing's way)."""
    if exitcode >= 0:
        return f"exit code {exitcode}"
    try:
        return f"signal {signal.Signals(-exitcode).name}"
    except ValueError:
        return f"signal {-exitcode}"


def run_world(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple[Any, ...] = (),
    timeout: float | None = 90.0,
    collective_timeout: float = 30.0,
    env: dict[str, str] | None = None,
    grace: float = 5.0,
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` ranks; return the per-rank results, by rank.

    ``timeout``: seconds for the whole run, start-up included (None: no limit; a
    hung collective still ends at ``collective_timeout``, passed to every rank's
    :func:`disttrain.comm.init`). ``env``: extra environment for every rank. Nothing
    is run twice: gloo's failures to connect the ranks are tried again where the group
    forms (:mod:`disttrain.comm.forming`), not here.
    """
    ctx = _context()
    # the ranks' shared-memory segments carry this tag: what a killed rank left is removed;
    # the whole environment travels: the fork server holds the one it started with
    env = {**os.environ, JOB_ENV: f"w{os.getpid()}x{uuid.uuid4().hex[:8]}", **(env or {})}
    folder = jobdir.make("world")
    store = os.path.join(folder, "store")  # world.init adds the restart round: store.0
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_entry,
            args=(r, world_size, store, fn, args, results, collective_timeout, env),
            daemon=True,  # ended with this process, whatever happens to it
        )
        for r in range(world_size)
    ]
    got = _Reports(results)
    try:
        for p in procs:
            p.start()
        _collect(got, procs, timeout, grace)
        if got.errors:
            raise RankError(_report(got.errors))
        return [got.out[r] for r in range(world_size)]
    finally:
        _stop(procs, clean=not got.errors and len(got.out) == world_size)
        results.close()
        shutil.rmtree(folder, ignore_errors=True)
        remove_leftovers(env[JOB_ENV])


class _Reports:
    """What the ranks sent so far: results by rank, failures in the order they came."""

    def __init__(self, results: Any) -> None:
        self.results = results  # the ranks' queue
        self.out: dict[int, Any] = {}
        self.errors: list[str] = []
        self.reported: set[int] = set()

    def take(self, item: tuple[int, bool, Any]) -> None:
        """File one rank's ``(rank, ok, value)``: its result, or its error text."""
        rank, ok, value = item
        self.reported.add(rank)
        if ok:
            self.out[rank] = _unpack(value)
        else:
            self.errors.append(f"rank {rank}: {value}")

    def reap_exited(self, procs: list[Any]) -> None:
        """Each rank that exited unreported: read what it sent, else name it as died."""
        for r, p in enumerate(procs):
            if p.exitcode is None or r in self.reported:
                continue
            # It exited: anything it sent is in the pipe by now (a queue's feeder
            # thread flushes before the process ends), so read that first.
            try:
                while r not in self.reported:
                    self.take(self.results.get_nowait())
            except queue.Empty:
                self.reported.add(r)
                self.errors.append(f"rank {r} died without a result ({_how_it_ended(p.exitcode)})")


def _collect(got: _Reports, procs: list[Any], timeout: float | None, grace: float) -> None:
    """Read reports until every rank has one, the grace after a failure ends, or the timeout.

    Raises :class:`WorldTimeout` at the timeout if no rank failed; with a
    failure, the ranks still running are listed as one more error instead.
    """
    world_size = len(procs)
    deadline = None if timeout is None else time.monotonic() + timeout
    stop_at: float | None = None  # set by the first failure: the others' grace ends then
    while len(got.reported) < world_size:
        now = time.monotonic()
        running = sorted(set(range(world_size)) - got.reported)
        if got.errors and stop_at is not None and now >= stop_at:
            got.errors.append(f"ranks {running} still running {grace:g} s after a failure: stopped")
            break
        if deadline is not None and now >= deadline:
            if got.errors:  # a failure is the likelier cause: name it first
                got.errors.append(f"ranks {running} still running at the timeout: stopped")
                break
            raise WorldTimeout(
                f"ranks {running} still running after {timeout:g} s "
                f"(finished: {sorted(got.reported) or 'none'}); every rank stopped"
            )
        try:
            got.take(got.results.get(timeout=0.2))
        except queue.Empty:
            got.reap_exited(procs)
        if got.errors and stop_at is None:
            stop_at = time.monotonic() + grace


def _stop(procs: list[Any], clean: bool) -> None:
    """End every rank: after a clean run each gets 5 s to leave its group; the rest are killed."""
    for p in procs:
        if clean and p.pid is not None:
            p.join(timeout=5)  # leaving the process group; then gone
        if p.is_alive():
            p.kill()
        if p.pid is not None:
            p.join()
