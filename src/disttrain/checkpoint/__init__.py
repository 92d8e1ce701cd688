"""L0: checkpoints on torch.distributed.checkpoint that survive a crash mid-save, belong to one
run, are refused if foreign, and resume on another number of workers where the strategy can.

Layout under ``DIR/checkpoints/``::

    step-00000100/rank-00003/     worker 3's state: a DCP folder (.metadata, __0_0.distcp)
                                  plus state.json (format tag, run, step, structure)
    step-00000100/server-00000/   a named part (a parameter server's shard, by shard index)
    step-00000100/COMMIT          {"format", "step", "run", "world_size", "settings"}: written
                                  last, by rank 0 (settings: what a resume must match)
    .step-00000100.RUN.tmp/       the same step while it is being written (not a checkpoint)

Every checkpoint belongs to one run, named by a run id (``uuid4().hex``) that the
launcher draws for a fresh run and hands to every process (``DISTTRAIN_RUN_ID``);
elastic restarts keep it and ``--resume DIR`` continues DIR's run under DIR's id.
Only a run's own steps are listed, loaded and pruned (the two newest are kept).

A committed step folder is never rewritten in place. Each process writes its part
into the run's staging folder for the step (:mod:`disttrain.checkpoint.dcp`: DCP's
writer, files fsync'ed; with ``background`` the process's writer thread writes a copy,
and the caller waits for it before the commit's barrier); after a barrier rank 0 writes COMMIT
there and renames the whole folder to ``step-N`` in one ``rename`` (refused if
``step-N`` exists), then fsyncs ``checkpoints/`` so the new entry survives a power cut.
A crash at any point thus leaves either no step N or a complete one, written by one
run. Loading unpickles nothing (tensors through ``torch.load(weights_only=True)``, the
rest JSON), and each part must carry our format tag and the run's id.

:func:`restore` resumes worker ``rank`` of ``world`` workers; a checkpoint of another
number of workers is handed to the strategy's ``reshard`` (which reads the old
workers' parts it needs) or refused with one line.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable, Collection
from types import ModuleType
from typing import Any

from disttrain.checkpoint import background as _background
from disttrain.checkpoint.durable import fsync_dir, makedirs, remove, write_atomic
from disttrain.comm.errors import UsageError

__all__ = [
    "FORMAT",
    "RUN_ENV",
    "claim",
    "clear_staging",
    "commit",
    "current_run",
    "latest",
    "load",
    "new_run_id",
    "restore",
    "resume_source",
    "run_of",
    "runs",
    "save",
    "saved_settings",
    "saved_world",
    "step_dir",
]

FORMAT = "disttrain-checkpoint-v2-dcp"
#: The environment variable that hands a run's id to every process of the job.
RUN_ENV = "DISTTRAIN_RUN_ID"
_STEP = re.compile(r"^step-(\d{8})$")
_STAGING = re.compile(r"^\.step-(\d{8})\.(\w*)\.tmp$")
_RUN = re.compile(r"^\w*$")  # a run id is part of a folder name


def _dcp() -> ModuleType:
    """The DCP reader and writer, imported at first use: importing torch.distributed.checkpoint
    costs about 0.8 s of CPU in every process, and most runs never save or resume."""
    from disttrain.checkpoint import dcp

    return dcp


def new_run_id() -> str:
    return uuid.uuid4().hex


def current_run() -> str | None:
    """This process's run (``DISTTRAIN_RUN_ID``); None outside a job (tests, tools)."""
    return os.environ.get(RUN_ENV)


def _own(run: str | None) -> str:
    """The run that writes: the one given, else this process's ("" outside a job)."""
    run = current_run() if run is None else run
    run = run or ""
    if not _RUN.match(run):
        raise ValueError(f"run id {run!r} is not a word (letters, digits, _)")
    return run


def _base(root: str) -> str:
    return os.path.join(root, "checkpoints")


def step_dir(root: str, step: int) -> str:
    """The committed folder of ``step`` under ``root`` (a run's --out)."""
    return os.path.join(_base(root), f"step-{step:08d}")


def _staging(root: str, step: int, run: str) -> str:
    return os.path.join(_base(root), f".step-{step:08d}.{run}.tmp")


def _part(rank: int | str) -> str:
    """The folder of one process's part: a worker by rank, or a named part (``server-00000``)."""
    return rank if isinstance(rank, str) else f"rank-{rank:05d}"


def save(
    root: str,
    step: int,
    rank: int | str,
    world_size: int,
    state: dict[str, Any],
    run: str | None = None,
    background: bool = False,
    replicated: Collection[str] = (),
) -> Callable[[], None]:
    """Write this process's ``state`` for ``step`` of ``run``; rank 0 commits after a barrier.

    Returns a function that waits until the part is on disk: at once, or with
    ``background`` once the writer thread (:mod:`~disttrain.checkpoint.background`) has
    written the copy taken here (call it before the barrier that precedes the commit).
    ``world_size``: the number of workers of the run. ``replicated``: paths of ``state``
    equal on every worker (``ShapesCheckpoint.replicated_state``): worker ``rank`` writes only its
    1/``world_size`` of them, and a load reads the rest from the other workers' parts.
    """
    run = _own(run)
    folder = _staging(root, step, run)
    header = {"format": FORMAT, "run": run, "step": step, "rank": rank, "world_size": world_size}
    if not isinstance(rank, int) or world_size < 2:
        replicated = ()  # a named part (a server's) has no siblings to share with
    # a copy: training may go on while it is written
    packed = _dcp().pack(
        state,
        _background.staging() if background else None,
        replicated,
        (rank, world_size) if replicated else (0, 1),
    )

    def write() -> None:
        makedirs(folder)
        _dcp().write(os.path.join(folder, _part(rank)), header, packed)

    if background:
        return _background.submit(write, reads_staging=True)
    write()
    return lambda: None


def commit(
    root: str,
    step: int,
    keep: int = 2,
    run: str | None = None,
    world_size: int | None = None,
    background: bool = False,
    settings: dict[str, Any] | None = None,
) -> Callable[[], None]:
    """Mark ``step`` of ``run`` complete (rank 0, after all ranks saved); drop its older steps.

    ``world_size``: the number of workers that wrote it (default: rank 0's part says).
    ``background``: on the writer thread, after the saves handed to it; the returned
    function waits for the commit (at once without ``background``). ``settings``: what a
    resume must match (JSON values; :func:`saved_settings`).
    """
    run = _own(run)
    if background:
        return _background.submit(lambda: _commit(root, step, keep, run, world_size, settings))
    _commit(root, step, keep, run, world_size, settings)
    return lambda: None


def _commit(
    root: str,
    step: int,
    keep: int,
    run: str,
    world_size: int | None,
    settings: dict[str, Any] | None = None,
) -> None:
    staging, final = _staging(root, step, run), step_dir(root, step)
    if os.path.exists(final):
        raise FileExistsError(f"checkpoint step {step} is already committed in {_base(root)}")
    if world_size is None:  # the worker count rank 0's part was written by (None: unknown)
        try:
            with open(os.path.join(staging, _part(0), _dcp().STATE_FILE)) as fh:
                world_size = int(json.load(fh)["world_size"])
        except (OSError, ValueError, KeyError, TypeError):
            world_size = None
    fields = {
        "format": FORMAT,
        "step": step,
        "run": run,
        "world_size": world_size,
        **({"settings": settings} if settings else {}),
    }
    marker = json.dumps(fields).encode()
    write_atomic(os.path.join(staging, "COMMIT"), lambda fh: fh.write(marker))
    os.rename(staging, final)  # atomic: the step appears complete or not at all
    fsync_dir(_base(root))
    for old in _committed(root, run)[:-keep]:
        remove(step_dir(root, old))
    for name, s, r in _staged(root):  # this run's partial saves that were never committed
        if r == run and s < step:
            remove(os.path.join(_base(root), name))


def _staged(root: str) -> list[tuple[str, int, str]]:
    base = _base(root)
    names = os.listdir(base) if os.path.isdir(base) else []
    return [(n, int(m.group(1)), m.group(2)) for n in names if (m := _STAGING.match(n))]


def clear_staging(root: str, run: str) -> None:
    """Delete ``run``'s partial saves (a crashed attempt's); rank 0, before anyone saves."""
    for name, _, r in _staged(root):
        if r == run:
            remove(os.path.join(_base(root), name))


def _commit_run(folder: str) -> str | None:
    """The run a step folder's COMMIT names; None if it has none ("" for a bare step number)."""
    try:
        with open(os.path.join(folder, "COMMIT")) as fh:
            text = fh.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return str(json.loads(text)["run"])
    except (ValueError, KeyError, TypeError):  # an older marker: the step number alone
        return ""


def runs(root: str) -> dict[str, list[int]]:
    """Every run with committed steps under ``root``, with its steps (ascending)."""
    base = _base(root)
    out: dict[str, list[int]] = {}
    for name in sorted(os.listdir(base) if os.path.isdir(base) else []):
        m = _STEP.match(name)
        run = _commit_run(os.path.join(base, name)) if m else None
        if m and run is not None:
            out.setdefault(run, []).append(int(m.group(1)))
    return out


def _committed(root: str, run: str | None) -> list[int]:
    held = runs(root)
    if run is not None:
        return held.get(run, [])
    return sorted(s for steps in held.values() for s in steps)


def latest(root: str, run: str | None = None) -> int | None:
    """The newest committed step of ``run`` (default: this process's, else any) under ``root``."""
    steps = _committed(root, current_run() if run is None else run)
    return steps[-1] if steps else None


def _held(held: dict[str, list[int]]) -> str:
    return "; ".join(
        f"run {r[:8] or '(no id)'} steps {', '.join(map(str, s))}" for r, s in held.items()
    )


def run_of(root: str) -> str:
    """The run whose checkpoints ``--resume ROOT`` continues: the one run ``root`` holds."""
    if not os.path.isdir(root):
        raise UsageError(f"--resume {root}: no such folder")
    held = runs(root)
    if not held:
        raise UsageError(f"--resume {root}: no complete checkpoint in {root}/checkpoints")
    if len(held) > 1:
        raise UsageError(
            f"--resume {root}: holds the checkpoints of {len(held)} runs ({_held(held)}); "
            "keep one run's step folders there"
        )
    return next(iter(held))


def _same_folder(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def claim(out: str, resume: str = "", overwrite: bool = False, restarted: bool = False) -> str:
    """The run id of a run about to write to ``out``; refuses an ``out`` holding other checkpoints.

    A fresh run draws a new id; ``--resume DIR`` continues DIR's run (its id). The
    run's ``out`` must hold no committed checkpoint unless it is the resumed folder
    itself; otherwise UsageError, or with ``overwrite`` they are deleted. ``restarted``
    (an elastic restart under torchrun, where no launcher drew the id): the run of
    ``out``'s newest step, which the first round claimed.
    """
    if restarted:
        held = runs(out) if out else {}
        if held:
            return max(held, key=lambda r: held[r][-1])
        return run_of(resume) if resume else new_run_id()
    run = run_of(resume) if resume else new_run_id()
    if out and not (resume and _same_folder(out, resume)):
        held = runs(out)
        if held and not overwrite:
            raise UsageError(
                f"--out {out} already holds checkpoints ({_held(held)}): resume that run with "
                f"--resume {out}, choose another folder with --out, or pass --overwrite to "
                "delete them"
            )
        if held:
            remove(_base(out))
    return run


def _reason(exc: BaseException) -> str:
    """One line out of a loader's refusal: the rule the file broke."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if lines and lines[0].startswith("Weights only load failed"):
        # torch's advice comes first; the line naming the refused global or opcode follows
        advice = ("Check the documentation", "Please file an issue")
        details = [x for x in lines[1:] if not x.startswith(advice)]
        return f"refused by weights_only: {details[0] if details else '?'}"
    if not lines:  # a bare error (a DCP file cut short): the cause's message, if it has one
        cause = exc.__cause__ or exc.__context__
        if cause is not None and str(cause).strip():
            return _reason(cause)
        return f"{type(exc).__name__} while reading it: a file cut short or damaged"
    return lines[0].split(". This is")[0]


def _step_of(root: str, step: int | None, run: str | None) -> tuple[str, int]:
    """(run, step) that a load reads: ``run``'s newest (or the given) committed step."""
    if not os.path.isdir(root):
        raise UsageError(f"--resume {root}: no such folder")
    run = current_run() if run is None else run
    run = run_of(root) if run is None else run
    step = latest(root, run) if step is None else step
    if step is None:
        raise UsageError(f"--resume {root}: no complete checkpoint in {root}/checkpoints")
    return run, step


def saved_world(root: str, step: int | None = None, run: str | None = None) -> int:
    """How many workers wrote ``run``'s newest (or the given) committed step under ``root``."""
    run, step = _step_of(root, step, run)
    try:
        with open(os.path.join(step_dir(root, step), "COMMIT")) as fh:
            marker = json.load(fh)
        return int(marker["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        raise UsageError(
            f"--resume: {step_dir(root, step)} is not a {FORMAT} checkpoint (its COMMIT "
            "names no format and worker count: written by an older disttrain?)"
        ) from None


def saved_settings(root: str, step: int | None = None, run: str | None = None) -> dict[str, Any]:
    """The settings ``commit`` recorded for ``run``'s newest (or the given) step ({}: none,
    as in a checkpoint written before they were recorded)."""
    run, step = _step_of(root, step, run)
    try:
        with open(os.path.join(step_dir(root, step), "COMMIT")) as fh:
            settings = json.load(fh).get("settings", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return settings if isinstance(settings, dict) else {}


def load(
    root: str,
    rank: int | str,
    world_size: int | None,
    step: int | None = None,
    run: str | None = None,
) -> dict[str, Any]:
    """This rank's (or named part's) state from ``run``'s newest (or the given) committed step.

    ``run`` defaults to this process's run; outside a job, to the one run ``root`` holds.
    ``world_size`` must be the number of workers that wrote it (see :func:`restore`);
    None: any.
    """
    run, step = _step_of(root, step, run)
    path = os.path.join(step_dir(root, step), _part(rank))
    if not os.path.isdir(path):
        raise UsageError(f"--resume {root}: step {step} has no state for {_part(rank)}")
    try:
        header, body = _dcp().read(path, lambda j: os.path.join(step_dir(root, step), _part(j)))
    except Exception as exc:  # unpickling refused, truncated or foreign files
        raise UsageError(
            f"--resume: {path} is not a disttrain checkpoint ({_reason(exc)})"
        ) from None
    if header.get("format") != FORMAT:
        raise UsageError(f"--resume: {path} is not a disttrain checkpoint (no {FORMAT} tag)")
    if header.get("run", "") != run:  # a step whose files two runs wrote: not ours to load
        raise UsageError(f"--resume: {path} belongs to run {header.get('run')!r}, not {run!r}")
    if world_size is not None and header.get("world_size") != world_size:
        raise UsageError(
            f"--resume: the checkpoint was written by {header['world_size']} workers, this run "
            f"has {world_size}; resume with --workers {header['world_size']}"
        )
    return {**header, **body}


#: ``reshard(read, old_world, rank, world)``: worker ``rank``'s state among ``world``
#: workers, out of a checkpoint of ``old_world`` (``read(j)``: old worker j's state).
Reshard = Callable[[Callable[[int], dict[str, Any]], int, int, int], dict[str, Any]]


def restore(
    root: str, rank: int, world_size: int, reshard: Reshard | None, who: str = "this strategy"
) -> dict[str, Any]:
    """Worker ``rank``'s state from ``root``'s newest step: its own, or resharded.

    A checkpoint of the same number of workers gives each its own part. One of
    another number goes through ``reshard``; None refuses it (UsageError naming the
    worker count that would resume it).
    """
    run, step = _step_of(root, None, None)
    old = saved_world(root, step, run)
    if old == world_size:
        return load(root, rank, world_size, step, run)
    if reshard is None:
        raise UsageError(
            f"--resume: the checkpoint was written by {old} workers, this run has "
            f"{world_size}; {who} cannot change its layout: resume with --workers {old}"
        )
    return reshard(lambda j: load(root, j, old, step, run), old, rank, world_size)


def resume_source(resume: str, out: str) -> str:
    """Where to restore from: after an elastic restart one's own ``--out``, else ``--resume``.

    A restart continues from the run's newest step in ``--out`` when it has one
    (after a ``--resume``, those are newer than the resumed folder's); empty when
    the run starts afresh. Shared by workers (the trainer) and by parameter
    servers, which restore their shards and optimizer themselves.
    """
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    if restarted and out and latest(out) is not None:
        return out
    return resume
