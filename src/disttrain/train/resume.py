"""Where a run starts: the run its checkpoints belong to, and the step it goes on from
(``--resume``, or an elastic restart's last commit)."""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
import torch.distributed as dist

from disttrain import checkpoint, strategies
from disttrain.comm import world as world_mod
from disttrain.strategies.capabilities import Reshards, load_model_state_dict
from disttrain.train.step import StepRunner

__all__ = ["agree_run", "apply_state", "goes_on", "resume", "say_where_it_goes_on"]


def agree_run(tc: Any, world: world_mod.World) -> str:
    """The run every process's checkpoints belong to (docs/reliability.md, "Checkpoints").

    Our launcher draws it before the workers start (``DISTTRAIN_RUN_ID``). Under
    ``torchrun`` without it, rank 0 decides as the launcher would (and refuses an
    ``--out`` holding another run's checkpoints); a restart takes the run of the
    newest step in ``--out``. Rank 0's id is broadcast, so every process (servers,
    every node) uses one id; rank 0 first deletes that run's partial saves.
    """
    run = checkpoint.current_run()
    if world.rank == 0:
        if run is None:
            restarted = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"
            run = checkpoint.claim(tc.out, tc.resume, tc.overwrite, restarted)
        if tc.out:
            checkpoint.clear_staging(tc.out, run)
    if world.world_size > 1:
        buf = torch.zeros(64, dtype=torch.uint8, device=world.device)  # a uuid4 hex is 32
        if world.rank == 0:
            buf[: len(run or "")] = torch.tensor(list((run or "").encode()), dtype=torch.uint8)
        dist.broadcast(buf, src=0)
        run = bytes(buf.cpu().tolist()).rstrip(b"\0").decode()
    os.environ[checkpoint.RUN_ENV] = run or ""  # read by checkpoint.save/load in this process
    return run or ""


def goes_on(tc: Any) -> bool:
    """This run continues an earlier one's ``--out``: an elastic restart, or ``--resume DIR
    --out DIR``. Its metrics.jsonl is appended to: the log keeps what ran, a step run again
    after the last checkpoint included (tests/test_elastic.py reads it so)."""
    restarted = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"
    in_place = bool(tc.resume and tc.out) and os.path.realpath(tc.resume) == os.path.realpath(
        tc.out
    )
    return restarted or in_place


def say_where_it_goes_on(resumed: int, run_id: str) -> None:
    """Rank 0: the step a resume or a restart goes on from, also when there is none to go
    on from (a restart before the first commit trains again from step 1, and says so)."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if resumed:  # a --resume, or an elastic restart from the last checkpoint
        print(f"disttrain: resumed from step {resumed} of run {run_id}", file=sys.stderr)
    elif restart != "0":
        print(
            f"disttrain: restart {restart}: no committed checkpoint yet, so training starts "
            "again from step 1",
            file=sys.stderr,
        )


def resume(
    tc: Any, strategy: strategies.Strategy, optimizer: torch.optim.Optimizer, runner: StepRunner
) -> int:
    """Restore this rank from ``--resume`` (or, after an elastic restart, from ``--out``)."""
    source = checkpoint.resume_source(tc.resume, tc.out)
    if not source:
        return 0
    n = dist.get_world_size(strategy.roles.worker_group)
    cls = type(strategy)
    # another worker count: the strategy's reshard reads the old workers' parts it needs
    state = checkpoint.restore(
        source,
        strategy.world.rank,
        n,
        cls.reshard if issubclass(cls, Reshards) else None,
        f"--strategy {cls.name}",
    )
    apply_state(state, strategy, optimizer, runner)
    return int(state["step"])


def apply_state(
    state: dict[str, Any],
    strategy: strategies.Strategy,
    optimizer: torch.optim.Optimizer,
    runner: StepRunner,
) -> None:
    """Load one worker's state (``saver.rank_state``'s) into its strategy, model, optimizer,
    loss scale and random generator (a ``--resume``, or ``run.load_state_dict``)."""
    # the strategy first: it may refuse a checkpoint of another layout (pipeline stages)
    # with one line, before the model's load_state_dict fails on the mismatched keys
    strategy.load_state_dict(state["strategy"])
    load_model_state_dict(strategy, state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if runner.scaler and state["scaler"]:
        runner.scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng"])
