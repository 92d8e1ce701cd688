"""The training loop that every strategy shares: one process's view of one run.

    for each step: forward + backward (compute) -> strategy.after_backward
    (communication) -> optimizer.step -> strategy.after_step

Rank 0 evaluates on the test set after every epoch, writes metrics.jsonl,
summary.json and model.pt, and shows the progress bar.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from disttrain import checkpoint, collectives, strategies, timeline
from disttrain.collectives import checks
from disttrain.comm import world as world_mod
from disttrain.comm.meter import meter
from disttrain.config import RunConfig
from disttrain.data import Dataset, GlobalBatchSampler, load_dataset
from disttrain.data.loader import BatchLoader
from disttrain.data.sampler import run_steps
from disttrain.models import build_model
from disttrain.train.faults import parse_fault
from disttrain.train.grow import Grow, Joiner, read_point
from disttrain.train.metrics import MetricsWriter, Throughput, Timers, write_summary
from disttrain.train.oom import as_out_of_memory
from disttrain.train.optimizers import make_optimizer
from disttrain.train.progress import ProgressBar
from disttrain.train.saver import Checkpoints, recorded_settings
from disttrain.train.schedules import LRSchedule
from disttrain.train.shrink import Shrink, membership_for
from disttrain.train.step import StepRunner
from disttrain.train.trackers import Tracker, trackers_for

__all__ = ["evaluate", "loss_fn", "train"]


def pin_to_cpu(local_rank: int) -> int | None:
    """Pin this process to one allowed CPU (local rank mod their number); None if not allowed."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
        cpu = cpus[local_rank % len(cpus)]
        os.sched_setaffinity(0, {cpu})
    except (AttributeError, OSError):  # not Linux, or not permitted here
        return None
    return cpu


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy, over classes or (for language models) over every position."""
    if output.dim() == 3:
        return F.cross_entropy(output.flatten(0, 1), target.flatten())
    return F.cross_entropy(output, target)


@torch.no_grad()
def evaluate(
    model: nn.Module, data: Dataset, device: torch.device, batch: int = 512
) -> tuple[float, float | None]:
    """Mean test loss, and accuracy (None for language models)."""
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    for i in range(0, len(data.x_test), batch):
        x = data.x_test[i : i + batch].to(device)
        y = data.y_test[i : i + batch].to(device)
        out = model(x)
        total_loss += loss_fn(out, y).item() * len(x)
        if data.task == "classification":
            correct += int((out.argmax(dim=1) == y).sum())
        count += len(x)
    model.train()
    return total_loss / count, (correct / count if data.task == "classification" else None)


def _gather_floats(
    values: list[float], device: torch.device, group: dist.ProcessGroup | None
) -> list[list[float]]:
    """Every worker's ``values`` (end-of-run bookkeeping, outside the measured traffic)."""
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    n = dist.get_world_size(group)
    if n == 1:
        return [mine.tolist()]
    out = [torch.empty_like(mine) for _ in range(n)]
    dist.all_gather(out, mine, group=group)
    return [t.tolist() for t in out]


def _epoch_end(
    strategy: strategies.Strategy, data: Dataset, device: torch.device
) -> tuple[nn.Module | None, float, float | None]:
    """Evaluate the whole model on rank 0 (gathering it if the strategy splits it)."""
    with meter.paused():
        model = strategy.eval_model()
    if model is None:
        return None, float("nan"), None
    # a split strategy's whole model on rank 0 holds the other ranks' parts as received
    # (on the host): evaluated on the run's device (a no-op for the parts already there)
    return model, *evaluate(model.to(device), data, device)


def _agree_run(tc: Any, world: world_mod.World) -> str:
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


def _goes_on(tc: Any) -> bool:
    """This run continues an earlier one's ``--out``: an elastic restart, or ``--resume DIR
    --out DIR``. Its metrics.jsonl is appended to: the log keeps what ran, a step run again
    after the last checkpoint included (tests/test_elastic.py reads it so)."""
    restarted = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"
    in_place = bool(tc.resume and tc.out) and os.path.realpath(tc.resume) == os.path.realpath(
        tc.out
    )
    return restarted or in_place


def _say_where_it_goes_on(resumed: int, run_id: str) -> None:
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


def _resume(
    tc: Any, strategy: strategies.Strategy, optimizer: torch.optim.Optimizer, runner: StepRunner
) -> int:
    """Restore this rank from ``--resume`` (or, after an elastic restart, from ``--out``)."""
    source = checkpoint.resume_source(tc.resume, tc.out)
    if not source:
        return 0
    n = dist.get_world_size(strategy.worker_group)
    cls = type(strategy)
    # another worker count: the strategy's reshard reads the old workers' parts it needs
    state = checkpoint.restore(
        source,
        strategy.world.rank,
        n,
        cls.reshard if cls.reshards else None,
        f"--strategy {cls.name}",
    )
    # the strategy first: it may refuse a checkpoint of another layout (pipeline stages)
    # with one line, before the model's load_state_dict fails on the mismatched keys
    strategy.load_state_dict(state["strategy"])
    strategy.load_model_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if runner.scaler and state["scaler"]:
        runner.scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng"])
    return int(state["step"])


def train(cfg: RunConfig, trackers: Sequence[Tracker] = ()) -> dict[str, Any]:
    """Run the training described by ``cfg`` on this process; return its summary.

    Rank 0's summary is the job's. ``trackers`` are told the run's figures and
    checkpoints (:mod:`disttrain.train.trackers`) besides those ``cfg`` asks for.
    A failed allocation is raised as :class:`~disttrain.comm.errors.OutOfMemory`
    naming the rank, the bytes and the process's limit (:mod:`disttrain.train.oom`).
    """
    try:
        return _train(cfg, trackers)
    except RuntimeError as exc:
        rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
        oom = as_out_of_memory(exc, rank)
        if oom is None:
            raise
        raise oom from exc


def _train(cfg: RunConfig, trackers: Sequence[Tracker]) -> dict[str, Any]:
    tc = cfg.train
    world = world_mod.init(
        device=tc.device, timeout=tc.timeout, threads=tc.threads, backend=tc.backend
    )
    # --join: this process builds in a group of its own, then joins the job (train/grow.py)
    joiner = Joiner(tc, read_point(tc.join)) if tc.join else None
    run_id = os.environ.get(checkpoint.RUN_ENV, "") if joiner else _agree_run(tc, world)
    recorder = (
        timeline.start(joiner.launch_rank if joiner else world.rank) if (tc.timeline) else None
    )
    collectives.set_length_check(tc.check_collectives)
    collectives.set_inter_algorithm(tc.inter_algorithm)
    checks.set_checks_everywhere(tc.check_collectives)
    if tc.pin_cpus:
        pin_to_cpu(world.local_rank)
    fault = None if joiner else parse_fault(tc.inject_fault)  # the job's ranks' faults
    data = load_dataset(cfg.data)
    torch.manual_seed(tc.seed)  # every rank builds the same initial model
    strategy = strategies.get(tc.strategy)(cfg, world, loss_fn)
    sample = data.x_train[: tc.batch_size]  # what --balance time measures layers on
    model = strategy.prepare_model(build_model(tc.model, data), sample).to(world.device)
    optimizer = make_optimizer(model.parameters(), tc)
    strategy.setup(model, optimizer)
    roles = strategy.roles  # who trains and who serves (parameter servers)
    if not roles.is_worker:
        return roles.serve()
    meter.reset()  # count training traffic only, not the initial broadcast

    sampler = GlobalBatchSampler(
        len(data.x_train), tc.batch_size, strategy.data_rank, strategy.data_world_size, tc.seed
    )
    total_steps = run_steps(len(data.x_train), tc.batch_size, tc.epochs, tc.max_steps)
    # asynchronous strategies let fast workers run more steps, until the shared budget is spent
    epoch_limit, step_limit = roles.limits(tc.epochs, total_steps)
    main = world.is_main and joiner is None
    out_dir = tc.out
    if main and out_dir:
        os.makedirs(out_dir, exist_ok=True)
    metrics = MetricsWriter(
        os.path.join(out_dir, "metrics.jsonl") if main and out_dir else None,
        append=_goes_on(tc),
    )
    tracking = [*trackers_for(tc, main), *trackers]
    # the epochs the run will show: a --max-steps inside an epoch ends in that epoch
    # (the job's: an asynchronous worker's own limits are the whole budget, N times its share)
    shown_epochs = min(tc.epochs, epoch_limit, -(-total_steps // sampler.steps_per_epoch))
    bar = ProgressBar(total_steps, enabled=main and tc.progress, epochs=shown_epochs)
    timers = Timers()
    step, epochs_done, loss_value = 0, 0, float("nan")
    whole: nn.Module | None = None
    memory: dict[str, int] = {}
    test_loss, test_acc = float("nan"), None
    start = time.perf_counter()
    throughput = Throughput(tc.batch_size, start)  # samples/s of the steps this process runs
    runner = StepRunner(strategy, optimizer, tc, timers, fault, world.rank)
    schedule = LRSchedule(
        tc.lr,
        tc.batch_size,
        total_steps,
        sampler.steps_per_epoch,
        tc.lr_scaling,
        tc.base_batch_size,
        tc.warmup_epochs,
        tc.lr_schedule,
        tc.lr_gamma,
        tc.lr_step_epochs,
    )
    saver = Checkpoints(out_dir, strategy, tc.async_checkpoint, recorded_settings(cfg))
    membership = joiner.membership if joiner else membership_for(tc, world)
    changes: list[dict[str, Any]] = []  # summary.json's membership (shrink and grow)
    shrink = Shrink(tc, membership, changes) if membership and tc.live_shrink else None
    grow = Grow(tc, membership, changes) if membership and tc.live_grow else None
    if grow and main:
        grow.open(cfg, run_id)  # OUT/join.json: where a --join finds the job
    try:
        if joiner and grow:  # admitted at a step boundary, with rank 0's state
            resumed = joiner.join(grow, strategy, runner.scaler)
            world = strategy.world
            sampler = GlobalBatchSampler(
                len(data.x_train),
                tc.batch_size,
                strategy.data_rank,
                strategy.data_world_size,
                tc.seed,
            )
        else:
            resumed = _resume(tc, strategy, optimizer, runner)
        if main:
            _say_where_it_goes_on(resumed, run_id)
        step = resumed
        logged: dict[str, Any] | None = None  # this worker's last metrics.jsonl step line
        throughput.resumed_at(resumed)  # restored steps ran in another process's time
        epoch = resumed // sampler.steps_per_epoch
        while epoch < epoch_limit:
            skip = step - epoch * sampler.steps_per_epoch  # batches done before a resume
            change: dict[str, Any] | None = None
            loader = BatchLoader(
                data.x_train,
                data.y_train,
                sampler.epoch(epoch)[skip : skip + step_limit - step],
                world.device,
                tc.prefetch,
                delay_seconds=tc.loader_delay_ms / 1000,
            )
            for x, y in timeline.iterate(loader, "data"):
                if roles.should_stop():
                    break
                if grow and grow.due(step, step_limit):  # joiners come in: a new group
                    saver.finish()
                    change = grow.admit(step, strategy, runner.scaler)
                    break
                lr = schedule(step)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                step += 1
                began = time.perf_counter()
                try:
                    with timeline.span("step", step=step):
                        loss_value, skipped = runner.run(step, x, y)
                except Exception as exc:  # a lost peer: the survivors regroup (train/shrink.py)
                    change = (
                        shrink.recover(exc, step, strategy, began, runner.scaler, logged)
                        if shrink
                        else None
                    )
                    if change is None:
                        raise
                    step = change["step"] - 1  # the survivors go on from there, new shards
                    break
                elapsed = time.perf_counter() - start
                sps = throughput.samples_per_second(step, elapsed)
                # with live shrink every worker keeps its line: one that ran a step the
                # new rank 0 did not hands it over (shrink.even_out)
                if (main or shrink) and step % tc.log_every == 0:
                    record: dict[str, Any] = dict(
                        step=step,
                        epoch=epoch,
                        loss=loss_value,
                        lr=lr,
                        samples_per_second=sps,
                        wall_seconds=elapsed,
                        bytes_sent=meter.bytes_sent,
                        **strategy.step_metrics(),
                    )
                    if runner.scaler:
                        record.update(loss_scale=runner.scaler.scale, skipped=skipped)
                    logged = record
                    if main:
                        metrics.write(**record)
                        for tracker in tracking:
                            tracker.scalars(step, record)
                bar.update(step, epoch, loss_value, sps)
                if tc.checkpoint_every and step % tc.checkpoint_every == 0 and out_dir:
                    with timers.time("checkpoint"), timeline.span("checkpoint"):
                        saver.save(step, optimizer, runner)
                    for tracker in tracking:
                        tracker.checkpoint(step, checkpoint.step_dir(out_dir, step))
            timers.seconds["data"] += loader.wait_seconds
            if change is not None:  # the sampler re-cut for the survivors; the step again
                world = strategy.world
                sampler = GlobalBatchSampler(
                    len(data.x_train),
                    tc.batch_size,
                    strategy.data_rank,
                    strategy.data_world_size,
                    tc.seed,
                )
                if world.is_main and not main:  # rank 0 was lost: its successor writes
                    main = True
                    metrics = MetricsWriter(
                        os.path.join(out_dir, "metrics.jsonl") if out_dir else None, append=True
                    )
                line = shrink.take_caught_up() if shrink else None
                if main and line and line["step"] > metrics.last_step:
                    metrics.write(**line)  # the step only another survivor completed
                metrics.write(event="membership", **change)
                saver.drop()
                continue
            epochs_done = epoch + 1
            last = step >= step_limit or epoch == epoch_limit - 1 or roles.should_stop()
            memory = strategy.memory()  # what this worker holds at the end of a step
            if last:
                with timers.time("checkpoint"), timeline.span("checkpoint"):
                    saver.close()  # a background write's commit
                strategy.finish()
            with timers.time("eval"), timeline.span("eval"):
                whole, test_loss, test_acc = _epoch_end(strategy, data, world.device)
            if main:
                record = dict(
                    step=step,
                    epoch=epoch,
                    test_loss=test_loss,
                    test_accuracy=test_acc,
                    wall_seconds=time.perf_counter() - start,
                    bytes_sent=meter.bytes_sent,
                )
                metrics.write(**record)
                for tracker in tracking:
                    tracker.scalars(step, record)
            if last:
                break
            epoch += 1
    except BaseException:
        for tracker in tracking:
            tracker.close()
        raise
    finally:
        if grow and main:
            grow.close(step)
        bar.close()
        metrics.close()
        if recorder is not None:  # written even after a failure: the launcher merges what is
            timeline.stop()
            recorder.write(timeline.parts_folder(out_dir, tc.timeline))
    wall = time.perf_counter() - start
    train_seconds = wall - timers.seconds.get("eval", 0.0)
    with meter.paused():
        per_rank = _gather_floats(
            [float(meter.bytes_sent), float(meter.messages_sent)],
            world.device,
            strategy.worker_group,
        )
        names = sorted(memory)
        held = _gather_floats(
            [float(memory[k]) for k in names], world.device, strategy.worker_group
        )
    memory_per_rank = {k: [int(r[i]) for r in held] for i, k in enumerate(names)}
    if recorder is not None and main:  # the gather above: every worker has written its part
        timeline.merge(timeline.parts_folder(out_dir, tc.timeline), tc.timeline)
    summary: dict[str, Any] = {
        "strategy": tc.strategy,
        "algorithm": tc.algorithm,
        "model": tc.model,
        "dataset": data.name,
        "world_size": world.world_size,
        "workers": len(per_rank),
        "steps": step,
        # the job's passes over the data: an asynchronous worker's own count may pass the
        # run's --epochs (its limits let one worker do the whole budget), the job's cannot
        "epochs": min(epochs_done, tc.epochs),
        "global_batch_size": tc.batch_size,
        "parameters": sum(p.numel() for p in (whole or model).parameters()),
        "final_test_loss": test_loss,
        "final_train_loss": loss_value,
        "final_accuracy": test_acc,
        "wall_seconds": wall,
        "samples_per_second": throughput.samples_per_second(step, train_seconds),
        "bytes_sent_per_rank": sum(r[0] for r in per_rank) / len(per_rank),
        "bytes_sent_by_rank": [int(r[0]) for r in per_rank],
        "messages_sent_by_rank": [int(r[1]) for r in per_rank],
        "time_breakdown": timers.as_dict(),
        "memory_per_rank": memory_per_rank,
        "precision": tc.precision,
        "skipped_steps": runner.skipped_steps,
        "final_lr": schedule(max(step - 1, 0)),
        "run_id": run_id,
        "config": cfg.to_dict(),
        **strategy.summary(),
    }
    if membership is not None:  # every membership change, in order (docs/reliability.md)
        summary["membership"] = changes
    if main and out_dir:
        if whole is not None:
            torch.save(whole.state_dict(), os.path.join(out_dir, "model.pt"))
        write_summary(out_dir, summary)
    for tracker in tracking:
        tracker.finish(summary, main)
        tracker.close()
    return summary
