"""Everything that can be checked before a worker starts (bad input: exit code 2)."""

from __future__ import annotations

import os
import socket
import tempfile
from typing import Any

from disttrain.comm.errors import UsageError

__all__ = ["check_settings_read", "claim_run", "preflight", "unread_settings"]


def unread_settings(cfg: Any) -> dict[str, str]:
    """Each setting ``cfg`` changes from its default that the run will not read, with why.

    Always-read settings are read by the trainer and launcher; any other one must
    be declared by the chosen strategy's settings part (``StrategySettings.reads_settings``)
    and not be switched off by the run's other settings (``settings_not_read``).
    """
    from disttrain import collectives, strategies
    from disttrain.config import always_read, changed_settings, field_names, flag

    strategy = strategies.get(cfg.train.strategy)
    reads, off = strategy.settings.reads(cfg), strategy.settings.settings_not_read(cfg)
    out: dict[str, str] = {}
    # another data set's shape, or a run setting another switches off (fp16's scaler...):
    # their sections are always read, those parts are not
    switched_off = {**cfg.data.not_read(), **cfg.train.not_read()}
    for name, value in changed_settings(cfg).items():
        if name in switched_off:
            out[name] = switched_off[name]
            continue
        if always_read(name) or name in reads:
            continue
        given = f"--no-{flag(name)[2:]}" if value is False else flag(name)  # as typed
        algorithms = sorted(
            a for a, c in collectives.ALGORITHMS.items() if name in c.reads_settings
        )
        if algorithms:  # an algorithm's own setting (hierarchical's --inter-algorithm)
            run = (  # the strategy's algorithm, or that it reads none
                f"--algorithm {cfg.train.algorithm}"
                if "algorithm" in reads
                else "which reads no --algorithm"
            )
            out[name] = (
                f"{given} is read only by --algorithm {' or '.join(algorithms)} "
                f"(this run: --strategy {strategy.name}, {run})"
            )
            continue
        where = f"{given} is not used by --strategy {strategy.name}"
        if name in off:
            out[name] = f"{where} {off[name]}"
            continue
        users = sorted(
            s
            for s, kind in strategies.STRATEGIES.items()
            if name in field_names(kind.settings.reads_settings)
        )
        out[name] = f"{where} (used by: {', '.join(users) or 'no strategy'})"
    return out


def check_settings_read(cfg: Any) -> None:
    """UsageError naming the first setting given (or a component default) that nothing reads."""
    unread = unread_settings(cfg)
    if unread:
        raise UsageError(next(iter(unread.values())))


def preflight(cfg: Any) -> tuple[Any, Any]:
    """Check everything that can be checked before a worker starts (exit 2 on failure);
    the model and the data set it built for that (the launcher's memory plan reuses them)."""
    from disttrain import collectives, strategies
    from disttrain.data import load_dataset
    from disttrain.models import build_model
    from disttrain.train import grow, shrink
    from disttrain.train.faults import parse_fault
    from disttrain.train.workload import Workload

    tc = cfg.train
    check_paths(tc)
    check_endpoint(tc.rdzv_endpoint)
    strategy = strategies.get(tc.strategy)  # an unknown name: the registry's usage error
    # an unknown name: the registry's usage error (its settings, such as hierarchical's
    # --inter-algorithm, were validated with their section when the config was loaded)
    collectives.get(tc.algorithm)
    fault = parse_fault(tc.inject_fault)
    if fault and fault.rank >= tc.world_size:
        raise UsageError(
            f"--inject-fault names rank {fault.rank}, but there are {tc.world_size} workers"
        )
    if tc.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is available on this machine")
        from disttrain.launch.gpu_support import unproven_reason

        refusal = unproven_reason(cfg)  # only what a GPU run has proven (docs/gpu.md)
        if refusal:
            raise UsageError(refusal)
    if tc.precision == "bf16" and tc.device == "cpu":
        import sys

        from disttrain.amp import bf16_cpu_slowdown, bf16_warning

        warning = bf16_warning(bf16_cpu_slowdown())
        if warning:
            print(warning, file=sys.stderr)
    data = load_dataset(cfg.data)
    work = Workload(cfg.data, data)  # --loss and --metric: their functions found now
    if work.train_samples < tc.batch_size:
        raise UsageError(
            f"--batch-size {tc.batch_size} is larger than the {work.train_samples} training samples"
        )
    model = build_model(tc.model, data)
    if work.user:
        _forward_user_batch(tc, model, work)
    else:
        _forward_one_batch(tc, model, data)
    # Strategies check what needs the whole config (pipeline stages, mesh, ps modes) here.
    strategy.settings.validate_config(cfg, model)
    shrink.check(cfg)  # --min-workers: a strategy that goes on, one host, the batch splits
    grow.check(cfg)  # --max-workers: the same for a job that admits joiners
    # After the strategy's own checks, which name impossible values more precisely.
    check_settings_read(cfg)
    if tc.resume:
        _check_resume(cfg, strategy, model, work.train_samples)
    return model, data


def _check_resume(cfg: Any, strategy: Any, model: Any, train_samples: int) -> None:
    """``--resume DIR``: ours and complete, of this run's model, data set and strategy, not
    already done, and of a layout the strategy can resume (its own check); another number
    of workers only where the strategy reshards."""
    from disttrain import checkpoint
    from disttrain.strategies.capabilities import Reshards

    tc = cfg.train
    check_resume_matches(cfg, train_samples)
    strategy.settings.check_resume(cfg, model, checkpoint.load(tc.resume, 0, None))
    old = checkpoint.saved_world(tc.resume)
    if old != tc.world_size and not issubclass(strategy.runtime, Reshards):
        checkpoint.restore(tc.resume, 0, tc.world_size, None, f"--strategy {strategy.name}")


def check_resume_matches(cfg: Any, train_samples: int) -> None:
    """UsageError if ``--resume`` names a run of another model, data set or strategy (the
    settings its checkpoint recorded: train/saver.py), or one whose budget this run's
    already met: it would load nothing it can use, or train no step."""
    from disttrain import checkpoint
    from disttrain.config import flag
    from disttrain.data.sampler import run_steps
    from disttrain.train.saver import recorded_settings

    tc = cfg.train
    saved = checkpoint.saved_settings(tc.resume)
    for name, value in recorded_settings(cfg).items():
        if name in saved and saved[name] != value:
            f = flag(name)
            raise UsageError(
                f"--resume {tc.resume}: its checkpoint was written with {f} {saved[name]}, "
                f"this run has {f} {value}: resume with {f} {saved[name]}, or start a new run "
                "without --resume"
            )
    step = checkpoint.latest(tc.resume) or 0
    total = run_steps(train_samples, tc.batch_size, tc.epochs, tc.max_steps)
    if step >= total:
        raise UsageError(
            f"--resume {tc.resume}: run already complete at step {step} (this run's budget: "
            f"{total} steps); raise --epochs or --max-steps"
        )


def check_endpoint(endpoint: str) -> None:
    """``--rdzv-endpoint HOST[:PORT]``: a port torch's rendezvous can take (it raised a
    ValueError inside the agent), and a host this machine can resolve (else the agent's
    store connection failed after its own retries, with a traceback)."""
    if not endpoint:
        return
    host, sep, port = endpoint.rpartition(":") if ":" in endpoint else (endpoint, "", "")
    if sep and not (port.isdigit() and 0 < int(port) < 65536):
        raise UsageError(f"--rdzv-endpoint {endpoint}: the port must be 1..65535 (HOST:PORT)")
    host = host.strip("[]")  # an IPv6 address is written [ADDR]:PORT
    if not host:
        raise UsageError(f"--rdzv-endpoint {endpoint}: give the host (HOST:PORT)")
    try:
        socket.getaddrinfo(host, None)
    except OSError:  # (its reason depends on the resolver: not part of the line)
        raise UsageError(f"--rdzv-endpoint {endpoint}: cannot resolve host {host!r}") from None


def check_paths(tc: Any) -> None:
    """The folders and files the run will write can be written: one line, before any work."""
    for name in ("out", "tensorboard"):
        path = getattr(tc, name)
        _writable_folder(f"--{name} {path}", path)
    if tc.timeline:
        if os.path.isdir(tc.timeline):
            raise UsageError(f"--timeline {tc.timeline}: is a folder; name a .json file")
        _writable_folder(f"--timeline {tc.timeline}", os.path.dirname(os.path.abspath(tc.timeline)))


def _writable_folder(what: str, path: str) -> None:
    """UsageError unless ``path`` is a folder this process can write in, or can become one:
    its nearest existing ancestor is a folder that takes a file. Nothing is left behind,
    and the ranks of one job (``disttrain.train`` runs pre-flight in each) may check at once.
    """
    if not path:
        return
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{what}: {path} exists and is not a folder")
    nearest = os.path.abspath(path)
    while not os.path.exists(nearest):
        nearest = os.path.dirname(nearest)
    if not os.path.isdir(nearest):
        raise UsageError(f"{what}: {nearest} is not a folder")
    try:
        with tempfile.TemporaryFile(dir=nearest):  # /proc, read-only mounts: os.access says yes
            pass
    except OSError as exc:
        raise UsageError(f"{what}: cannot write in {nearest} ({exc.strerror})") from None


def _forward_one_batch(tc: Any, model: Any, data: Any) -> None:
    """One forward pass and loss of a worker's batch: a shape mistake in the model or the
    data is one line now, not a torch error per rank after every worker has started."""
    import torch

    from disttrain.train.trainer import loss_fn

    n = max(1, min(tc.batch_size // tc.world_size, 64, len(data.x_train)))
    x, y = data.x_train[:n], data.y_train[:n]
    what = f"--model {tc.model} on --dataset {data.name}: a batch x {tuple(x.shape)}"
    with torch.no_grad():
        try:
            out = model(x)
        except Exception as exc:  # shape, dtype or the model's own error: the user's to fix
            raise UsageError(f"{what} failed in forward: {_gist(exc)}") from None
        try:
            loss_fn(out, y)
        except Exception as exc:
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            # a language model's labels are (batch, positions): logits per position
            wanted = (
                f"(batch, {y.shape[1]}, {data.num_classes})"
                if y.dim() == 2
                else (f"(batch, {data.num_classes})")
            )
            raise UsageError(
                f"{what} gave output {shape}, but the loss needs {wanted} logits for labels "
                f"{tuple(y.shape)}: {_gist(exc)}"
            ) from None


def _forward_user_batch(tc: Any, model: Any, work: Any) -> None:
    """A user's data set: one batch through the model and the loss (and the metric), so
    that samples that do not stack, a forward that fails, an output the loss cannot read
    or a loss that is not a scalar is one line before any worker starts."""
    import torch

    from disttrain import batch as batches

    n = max(1, min(tc.batch_size // tc.world_size, 64))
    x, y = batches.inputs_and_target(work.data.sample(n))  # UsageError if they do not stack
    what = f"--model {tc.model} on --dataset {work.data.name}"
    with torch.no_grad():
        try:
            out = batches.call_model(model, x)
        except Exception as exc:
            raise UsageError(f"{what}: a batch failed in forward: {_gist(exc)}") from None
        try:
            work.loss(out, y)
        except UsageError as exc:
            raise UsageError(f"{what}: {exc}") from None
        except Exception as exc:
            raise UsageError(
                f"{what}: the loss ({work.loss_name}) cannot read the model's output "
                f"{type(out).__name__}: {_gist(exc)}"
            ) from None


def _gist(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"


def claim_run(tc: Any, out: str) -> str:
    """The run id of a run into ``out``, once pre-flight passed; before any worker starts.

    A fresh run draws a new one, ``--resume DIR`` continues DIR's run. An ``out``
    that holds checkpoints (other than the resumed folder's own) or an earlier run's
    results (:data:`RESULTS`) is refused, exit 2, unless ``--overwrite``, which
    deletes them (checkpoints: disttrain.checkpoint.claim).
    """
    from disttrain import checkpoint

    # checkpoints first: their refusal names the run to resume; --overwrite deletes them
    run = checkpoint.claim(out, tc.resume, tc.overwrite)
    same = bool(tc.resume) and os.path.realpath(tc.resume) == os.path.realpath(out)
    held = [n for n in RESULTS if os.path.isfile(os.path.join(out, n))] if not same else []
    if held and not tc.overwrite:
        raise UsageError(
            f"--out {out} already holds an earlier run's results ({', '.join(held)}): choose "
            "another folder with --out, or pass --overwrite to replace them"
        )
    for name in held:
        os.remove(os.path.join(out, name))
    return run


#: what a finished run leaves in its --out: another run into it must not replace them
#: silently (claim_run)
RESULTS = ("summary.json", "metrics.jsonl", "model.pt")
