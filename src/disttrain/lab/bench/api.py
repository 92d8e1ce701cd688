"""A user loop on dt.distribute against the same loop on torch DDP, and run.loader hiding
I/O-like loading, in paired rounds of one run (issue 49, "Speed").

    disttrain bench api --workers 2 --batch-size 64 --steps 20 --rounds 10 --json api.json

One world of N processes (file store, loopback, one torch thread each) builds four
configurations side by side, each its own copy of the same model (an MLP, by default the
trainer's 64-2048-2048-1024-10: 6.43 M parameters, 25.7 MB of fp32 gradients, so the
allreduce matters) with SGD (lr 0.01, momentum 0.9), on synthetic 8x8 digits-shaped data
of ``--steps`` global batches of ``--batch-size`` (one epoch per round):

- ``dt``: ``dt.distribute(model, opt, strategy="allreduce")`` (its defaults, or
  ``--algorithm``), ``for batch in run.loader(data, batch_size=B, shuffle=True,
  epoch=e): run.step(batch, F.cross_entropy)``. Its ``--algorithm auto`` has no table
  from the launcher here, as under torchrun: gloo's native allreduce, as DDP's;
- ``ddp``: ``DistributedDataParallel`` (gloo, its default buckets or ``--ddp-bucket-mb``)
  and ``DataLoader(data, batch_size=B/N, sampler=DistributedSampler(..., seed=0))`` with
  ``set_epoch(e)``, zero_grad / forward / ``backward()`` / ``opt.step()``. Its global
  batch t is the same set of samples as ``run.loader``'s (both draw ``randperm`` from
  seed 0 + epoch; a rank's share is strided here, contiguous there), so the two train the
  same steps: their parameters agree after the warm-up up to the order of the sums
  (checked; the difference grows with the steps, random labels on 6.4 M parameters);
- ``io``: ``dt``'s loop over a map-style dataset whose ``__getitem__`` sleeps, so that
  loading one rank's batch takes as long as a step (``--load-ms``; default: the median
  step of ``dt`` and ``noio`` in the warm-up), through ``run.loader(..., num_workers=2)``;
- ``noio``: the same dataset without the sleep, the same loader and ``num_workers``.

Each round is one epoch of each, in an order that rotates every round, after one
untimed epoch of ``--warmup`` steps each, so a burst of background load on a shared
machine hits all four alike. A round's time runs from a barrier before the loader is
made (its worker processes start in it: a user's loop pays that every epoch) to a
barrier after the last step. Figures: the job's samples/s, median over rounds with the
25th and 75th percentiles; the ratios dt / ddp and io / noio are medians of paired
per-round ratios (targets 1.0 and 0.9). Rank 0's time per step is split into the wait
for the next batch (the first one, with the workers' start, apart) and the step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["SleepyDataset", "add_arguments", "run"]

CONFIGS = ("dt", "ddp", "io", "noio")
LABELS = {
    "dt": "dt.distribute",
    "ddp": "DDP",
    "io": "dt, sleepy data",
    "noio": "dt, same, no sleep",
}
#: (numerator, denominator, target): issue 49's "Speed" criteria
PAIRS = (("dt", "ddp", 1.0), ("io", "noio", 0.9))
SHAPE = (1, 8, 8)  # digits-shaped inputs
CLASSES = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=2, help="processes")
    parser.add_argument("--batch-size", type=int, default=64, help="GLOBAL batch size")
    parser.add_argument(
        "--hidden", default="2048,2048,1024", help="the MLP's hidden widths (default: 6.43M)"
    )
    parser.add_argument("--steps", type=int, default=20, help="global batches per round (epoch)")
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps of each first")
    parser.add_argument(
        "--load-ms",
        type=float,
        default=0.0,
        help="ms the sleepy dataset takes for one rank's batch (0: the measured step)",
    )
    parser.add_argument("--num-workers", type=int, default=2, help="loader worker processes")
    parser.add_argument(
        "--algorithm", default="", help="dt.distribute's algorithm= (default: its own)"
    )
    parser.add_argument(
        "--ddp-bucket-mb", type=float, default=0.0, help="DDP's bucket_cap_mb (0: its default)"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    parser.add_argument("--json", default="", help="write every figure to this JSON file")


class SleepyDataset:
    """``(x[i], y[i])``, each after ``delay`` seconds of sleep: loading that waits as reading
    a file does, without taking a core (a map-style Dataset: ``__len__``, ``__getitem__``)."""

    def __init__(self, x: Any, y: Any, delay: float = 0.0) -> None:
        self.x, self.y, self.delay = x, y, delay

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        if self.delay > 0:
            time.sleep(self.delay)
        return self.x[i], self.y[i]


def _hidden(text: str) -> tuple[int, ...]:
    from disttrain.comm.errors import UsageError

    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        widths = ()
    if not widths or min(widths) < 1:
        raise UsageError(f"--hidden {text!r}: give positive widths separated by commas")
    return widths


#: one round's (waits, steps) of rank 0: seconds to the next batch, seconds in the step
Timed = tuple[list[float], list[float]]
Epoch = Callable[[int, int], Timed]


def _timed(batches: Iterable[Any], step: Callable[[Any], Any], limit: int) -> Timed:
    """Run ``step`` on each batch (the first ``limit``); each wait and each step's seconds."""
    waits: list[float] = []
    steps: list[float] = []
    t0 = time.perf_counter()
    for i, batch in enumerate(batches):  # iter() starts the loader's workers: in the wait
        t1 = time.perf_counter()
        step(batch)
        t2 = time.perf_counter()
        waits.append(t1 - t0)
        steps.append(t2 - t1)
        t0 = t2
        if i + 1 == limit:
            break
    return waits, steps


def _build(kind: str, args: argparse.Namespace, data: Any, state: dict[str, Any]) -> Epoch:
    """This rank's epoch of ``kind``: ``epoch(e, limit)`` trains epoch ``e``'s first
    ``limit`` global batches."""
    import torch
    from torch.nn import functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    from disttrain.api import distribute  # dt.distribute (the API package, one layer below)
    from disttrain.comm import world as world_mod
    from disttrain.models.mlp import mlp

    world = world_mod.current()
    torch.manual_seed(0)  # the same model for all four
    model = mlp(SHAPE[0] * SHAPE[1] * SHAPE[2], CLASSES, _hidden(args.hidden))
    state.setdefault("models", {})[kind] = model
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if kind == "ddp":
        bucket = {"bucket_cap_mb": args.ddp_bucket_mb} if args.ddp_bucket_mb else {}
        net = DDP(model, **bucket)
        sampler: DistributedSampler[Any] = DistributedSampler(
            data, num_replicas=world.world_size, rank=world.rank, shuffle=True, seed=0
        )
        loader = DataLoader(data, batch_size=args.batch_size // world.world_size, sampler=sampler)

        def ddp_step(batch: Any) -> None:
            x, y = batch
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(net(x), y).backward()
            opt.step()

        def ddp_epoch(epoch: int, limit: int) -> Timed:
            sampler.set_epoch(epoch)
            return _timed(loader, ddp_step, limit)

        return ddp_epoch
    settings = {"algorithm": args.algorithm} if args.algorithm else {}
    run = distribute(model, opt, strategy="allreduce", **settings)
    state.setdefault("runs", []).append(run)
    more = {"num_workers": args.num_workers} if kind in ("io", "noio") else {}

    def dt_epoch(epoch: int, limit: int) -> Timed:
        batches = run.loader(data, batch_size=args.batch_size, shuffle=True, epoch=epoch, **more)
        return _timed(batches, lambda batch: run.step(batch, F.cross_entropy), limit)

    return dt_epoch


def _warm_step(warm: dict[str, Timed]) -> float:
    """A step's seconds: the median of dt's and noio's warm-up steps after their first."""
    steps = [s for kind in ("dt", "noio") for s in warm[kind][1][1:]]
    return statistics.median(steps or [s for kind in ("dt", "noio") for s in warm[kind][1]])


def _spread(models: dict[str, Any], a: str, b: str) -> float:
    """max |a - b| over the parameters, relative to a's largest |value|."""
    pa = [p.detach().double() for p in models[a].parameters()]
    pb = [p.detach().double() for p in models[b].parameters()]
    diff = max(float((x - y).abs().max()) for x, y in zip(pa, pb, strict=True))
    return diff / max(float(x.abs().max()) for x in pa)


def _datasets(args: argparse.Namespace) -> tuple[dict[str, Any], SleepyDataset]:
    """The four configurations' data (the same tensors); the sleepy one's delay is set
    once the step is measured."""
    import torch
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(1234)
    num = args.batch_size * args.steps
    x = torch.randn(num, *SHAPE, generator=g)
    y = torch.randint(0, CLASSES, (num,), generator=g)
    sleepy = SleepyDataset(x, y)
    datasets = {"dt": TensorDataset(x, y), "ddp": TensorDataset(x, y), "io": sleepy}
    datasets["noio"] = SleepyDataset(x, y)
    return datasets, sleepy


def _warm_up(args: argparse.Namespace, epochs: dict[str, Any], sleepy: SleepyDataset) -> Any:
    """Each configuration's warm-up epoch; the sleepy loader's delay is the measured step
    (rank 0's figure, on every rank) unless --load-ms gives one."""
    import torch
    import torch.distributed as dist

    warm: dict[str, Timed] = {}
    for kind in ("dt", "ddp", "noio", "io"):  # noio before io: io's delay is noio's step
        if kind == "io":
            step_s = _warm_step(warm)
            load = torch.tensor([args.load_ms / 1e3 if args.load_ms > 0 else step_s])
            dist.broadcast(load, 0)
            sleepy.delay = float(load) / (args.batch_size // dist.get_world_size())
        dist.barrier()
        warm[kind] = epochs[kind](0, args.warmup)
    return warm


def _rounds(args: argparse.Namespace, epochs: dict[str, Any]) -> tuple[Any, Any]:
    """--rounds rounds of one epoch of each configuration, in an order rotating each round:
    the job's seconds (until the slowest rank is done) and each epoch's phases."""
    import torch.distributed as dist

    seconds: dict[str, list[float]] = {kind: [] for kind in CONFIGS}
    phases: dict[str, list[Timed]] = {kind: [] for kind in CONFIGS}
    for r in range(args.rounds):
        for k in range(len(CONFIGS)):
            kind = CONFIGS[(k + r) % len(CONFIGS)]
            dist.barrier()  # every rank starts the round's config together
            t0 = time.perf_counter()
            phases[kind].append(epochs[kind](1 + r, args.steps))
            dist.barrier()
            seconds[kind].append(time.perf_counter() - t0)
    return seconds, phases


def _rank_main(args: argparse.Namespace) -> dict[str, Any] | None:
    """One rank's run; rank 0 returns every config's round seconds, its waits and steps."""
    import multiprocessing

    import torch.distributed as dist

    # A rank of run_world is not quite the process a launcher (torchrun, disttrain run)
    # starts, in two ways that matter to a loader's worker processes: it is daemonic (it
    # ends with the runner), and multiprocessing refuses a daemonic process children;
    # and it inherits the runner's forkserver start method, under which each worker is
    # a fresh interpreter (1-2.5 s per loader here, measured) where a launcher's process
    # on Linux forks it (tens of ms). Made that process here: the workers watch this
    # rank and end with it, and the runner still ends the rank.
    multiprocessing.current_process()._config["daemon"] = False  # type: ignore[attr-defined]
    multiprocessing.set_start_method("fork", force=True)
    datasets, sleepy = _datasets(args)
    state: dict[str, Any] = {}
    epochs = {kind: _build(kind, args, datasets[kind], state) for kind in CONFIGS}
    warm = _warm_up(args, epochs, sleepy)
    models = state["models"]
    # the same steps on the same batches: equal parameters, up to the order of the sums
    # (the difference grows with the steps: random labels on 6.4 M parameters)
    warm_spread = {"dt/ddp": _spread(models, "dt", "ddp"), "io/noio": _spread(models, "io", "noio")}
    seconds, phases = _rounds(args, epochs)
    for run in state["runs"]:
        run.finish()
    params = sum(p.numel() for p in models["dt"].parameters())
    if dist.get_rank() != 0:
        return None
    return {
        "seconds": seconds,
        "phases": phases,
        "parameters": params,
        "load_per_batch_s": sleepy.delay * (args.batch_size // dist.get_world_size()),
        "sleep_per_sample_s": sleepy.delay,
        "warmup_step_s": _warm_step(warm),
        "parameter_spread_after_warmup": warm_spread,
        "parameter_spread": {
            "dt/ddp": _spread(models, "dt", "ddp"),
            "io/noio": _spread(models, "io", "noio"),
        },
    }


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    q = len(ordered) // 4
    return statistics.median(ordered), ordered[q], ordered[-1 - q]


def _summarise(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    samples = args.batch_size * args.steps
    rows: dict[str, Any] = {}
    for kind, times in raw["seconds"].items():
        median, p25, p75 = _quartiles([samples / t for t in times])
        rounds: list[tuple[list[float], list[float]]] = raw["phases"][kind]
        later = [w for waits, _ in rounds for w in waits[1:]]
        rows[kind] = {
            "samples_per_second": median,
            "p25": p25,
            "p75": p75,
            "step_ms": 1e3 * statistics.median([s for _, steps in rounds for s in steps]),
            "wait_ms": 1e3 * statistics.median(later) if later else 0.0,
            "first_wait_ms": 1e3 * statistics.median([waits[0] for waits, _ in rounds]),
        }
    for a, b, target in PAIRS:
        # paired: a's round r against b's round r, moments apart
        ratios = [tb / ta for ta, tb in zip(raw["seconds"][a], raw["seconds"][b], strict=True)]
        median, p25, p75 = _quartiles(ratios)
        rows[f"{a}/{b}"] = {"ratio": median, "p25": p25, "p75": p75, "target": target}
    return rows


def _check(args: argparse.Namespace) -> None:
    from disttrain.comm.errors import UsageError

    _hidden(args.hidden)
    if args.workers < 1 or args.batch_size < 1 or args.batch_size % args.workers:
        raise UsageError("--workers must be >= 1 and --batch-size a positive multiple of it")
    if args.rounds < 1 or args.steps < 1 or args.warmup < 1:
        raise UsageError("--rounds, --steps and --warmup must be >= 1")
    if args.warmup > args.steps:
        raise UsageError("--warmup is steps of one epoch: at most --steps")
    if args.load_ms < 0 or args.num_workers < 0 or args.ddp_bucket_mb < 0:
        raise UsageError("--load-ms, --num-workers and --ddp-bucket-mb must be >= 0")


def run(args: argparse.Namespace) -> int:
    _check(args)
    from disttrain.launch.spawn import RankError, WorldTimeout, run_world

    try:
        # --timeout bounds the whole run and, inside it, every collective
        raw = run_world(
            _rank_main, args.workers, (args,), timeout=args.timeout, collective_timeout=args.timeout
        )[0]
    except (RankError, WorldTimeout) as exc:
        sys.stderr.write(f"disttrain: error: bench api failed: {str(exc).splitlines()[0]}\n")
        return 1
    assert raw is not None
    rows = _summarise(raw, args)
    local = args.batch_size // args.workers
    print(
        f"bench api: mlp 64-{args.hidden.replace(',', '-')}-10 ({raw['parameters'] / 1e6:.2f}M "
        f"parameters), SGD, global batch {args.batch_size} over {args.workers} processes, "
        f"{args.rounds} rounds of one {args.steps}-step epoch each, rotated (medians, [p25, p75])"
    )
    print(
        f"{'':<20}{'samples/s':>10} {'[p25, p75]':>18} {'step ms':>8} {'wait ms':>8}"
        f" {'first ms':>9}"
    )
    for kind in CONFIGS:
        row = rows[kind]
        spread = f"[{row['p25']:.1f}, {row['p75']:.1f}]"
        print(
            f"{LABELS[kind]:<20}{row['samples_per_second']:>10.1f} {spread:>18} "
            f"{row['step_ms']:>8.1f} {row['wait_ms']:>8.2f} {row['first_wait_ms']:>9.1f}"
        )
    for a, b, target in PAIRS:
        row = rows[f"{a}/{b}"]
        verdict = "meets" if row["ratio"] >= target else "misses"
        print(
            f"{a} / {b:<15}{row['ratio']:>7.3f}x [{row['p25']:.3f}, {row['p75']:.3f}]"
            f"  ({verdict} the {target}x target)"
        )
    print(
        f"sleepy data: {local} samples x {raw['sleep_per_sample_s'] * 1e3:.2f} ms = "
        f"{raw['load_per_batch_s'] * 1e3:.1f} ms a rank's batch, {args.num_workers} loader "
        f"workers (the warm-up's step: {raw['warmup_step_s'] * 1e3:.1f} ms)"
    )
    warm, end = raw["parameter_spread_after_warmup"], raw["parameter_spread"]
    print(
        f"parameters, max |difference| / max |value|: after the {args.warmup} warm-up steps "
        f"{warm['dt/ddp']:.1e} (dt, ddp), {warm['io/noio']:.1e} (io, noio); at the end "
        f"{end['dt/ddp']:.1e}, {end['io/noio']:.1e}"
    )
    if args.json:
        with open(args.json, "w") as fh:
            record = {"args": vars(args) | {"bench_module": None}, "rows": rows}
            json.dump(record | raw, fh, indent=2)
    return 0
