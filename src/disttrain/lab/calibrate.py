"""``disttrain advise --calibrate``: measure this machine with `bench` runs, fit the cost model.

What is measured, and how each constant is fitted (:mod:`disttrain.lab.calibration`):

- ``bench allreduce`` (no length check) at n = 2..W local ranks: per n, the shared-host
  link (α per step, δ per message, β per byte over all ranks) by a relative least-squares
  fit of each row's 10th-percentile time (the machine's own cost, without most of the
  bursts other users cause) against the rows' paths; at n = 2 also the critical-path α, β.
- a timed ``a += b`` on 8 MB: γ, the memory cost of reducing a byte.
- ``bench dp`` with one rank at two batch sizes: forward+backward seconds per flop and the
  per-parameter seconds of a step (``plain`` rows); the trainer's fixed work per step
  (``disttrain-1``'s step time minus the same compute: data, zero_grad, hooks, meters; left
  out, every data-parallel step was under-predicted by 9-26 %); with n ranks at the same
  per-rank batch: how much slower compute runs when n ranks share this host's cores, and
  what the step takes beyond that compute and its predicted allreduces (the slowest rank's
  lateness, bucket copies, cold caches: ``Calibration.sync``).
- one-bit compression of 1M entries at 1 % density: encode and decode seconds per entry.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from disttrain.collectives.paths import critical_path
from disttrain.lab.calibration import Calibration, fit_compute, nonneg_relative_lstsq

if TYPE_CHECKING:
    from disttrain.lab import costmodel

__all__ = [
    "SHARED_MEMORY_SIZES",
    "STAT",
    "bench_allreduce_rows",
    "bench_dp_rows",
    "calibrate",
    "describe",
    "fit_shared_link",
    "fit_shm_link",
    "fit_sync",
    "loopback_network",
    "mlp_buckets",
    "mlp_params",
    "shared_memory_algorithms",
]

#: The per-row statistic the allreduce fits and the validation use.
STAT = "time_p10_s"
CAL_SIZES = ("4KB", "1MB", "8MB")
#: Shared-memory allreduces: one piece (4KB, 512KB: the barriers' and the copies'
#: constants), several (2MB, 8MB: the barriers between pieces); 64KB and 1MB stay held out.
SHARED_MEMORY_SIZES = ("4KB", "512KB", "2MB", "8MB")
CAL_BATCH = 16  # per-rank samples of the compute calibration (and 4x that)


def _run_quiet(module: Any, parser_args: list[str]) -> dict[str, Any]:
    """Parse ``parser_args`` with a bench's own flags, run it, return its JSON (output hidden)."""
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    with tempfile.TemporaryDirectory(prefix="disttrain-cal-") as folder:
        path = os.path.join(folder, "rows.json")
        args = parser.parse_args([*parser_args, "--json", path])
        with contextlib.redirect_stdout(io.StringIO()):
            code = module.run(args)
        if code != 0:
            raise RuntimeError(f"bench {' '.join(parser_args)} exited {code}")
        with open(path) as fh:
            result: dict[str, Any] = json.load(fh)
    return result


def bench_allreduce_rows(
    workers: int, sizes: Sequence[str], algorithms: Sequence[str], iters: int = 10, warmup: int = 2
) -> list[dict[str, Any]]:
    """`disttrain bench allreduce` rows (length check off: training runs without it)."""
    from disttrain.lab.bench import allreduce as bench_allreduce

    got = _run_quiet(
        bench_allreduce,
        [
            "--workers",
            str(workers),
            "--sizes",
            ",".join(sizes),
            "--algorithms",
            ",".join(algorithms),
            "--iters",
            str(iters),
            "--warmup",
            str(warmup),
            "--no-length-check",
            "--no-progress",
        ],
    )
    rows: list[dict[str, Any]] = got["rows"]
    return rows


def bench_dp_rows(
    workers: int, batch_size: int, fusion_mb: float = 4.0, steps: int = 10, warmup: int = 2
) -> dict[str, Any]:
    """`disttrain bench dp` rows for the mlp (name -> samples/s and per-phase medians)."""
    from disttrain.lab.bench import dp as bench_dp

    got = _run_quiet(
        bench_dp,
        [
            "--workers",
            str(workers),
            "--model",
            "mlp",
            "--batch-size",
            str(batch_size),
            "--fusion-mb",
            str(fusion_mb),
            "--steps",
            str(steps),
            "--warmup",
            str(warmup),
        ],
    )
    rows: dict[str, Any] = got["rows"]
    return rows


def mlp_params() -> tuple[int, list[int]]:
    """The bench mlp's parameter count and its gradient tensors' sizes in bytes (fp32)."""
    from disttrain.data import load_dataset
    from disttrain.models import build_model

    data = load_dataset("digits")  # as bench dp loads it
    model = build_model("mlp", data)
    sizes = [p.numel() * 4 for p in model.parameters()]
    return sum(sizes) // 4, sizes


def fit_shared_link(rows: Sequence[dict[str, Any]], n: int) -> list[float]:
    """[α, δ, β] of ranks sharing this host, from bench allreduce rows at ``n`` ranks."""
    paths = [critical_path(r["algorithm"], r["size"], n, 4) for r in rows]
    feats = [[p.steps, p.total_messages, p.total_bytes] for p in paths]
    return nonneg_relative_lstsq(feats, [r[STAT] for r in rows])


def shared_memory_algorithms() -> list[str]:
    """The allreduces whose ranks share one host's memory (``one_host``, not built of
    others): the calibration fits their barrier and copy constants apart."""
    from disttrain import collectives

    return [n for n, a in collectives.ALGORITHMS.items() if a.one_host and not a.composite]


def fit_shm_link(rows: Sequence[dict[str, Any]], n: int) -> list[float]:
    """[α per barrier, α per barrier between pieces, μ per byte copied by all ranks] of the
    shared-memory allreduces at ``n`` ranks, from their bench allreduce rows (the bench's
    native anchor rows, which copy nothing through shared memory, left out)."""
    mine = [r for r in rows if r["algorithm"] in shared_memory_algorithms()]
    paths = [critical_path(r["algorithm"], r["size"], n, 4) for r in mine]
    return nonneg_relative_lstsq(
        [[p.steps - p.inner_steps, p.inner_steps, p.total_copied] for p in paths],
        [r[STAT] for r in mine],
    )


def _gamma(nbytes: int = 8 << 20, reps: int = 15) -> float:
    import torch

    a = torch.ones(nbytes // 4)
    b = torch.ones(nbytes // 4)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a.add_(b)
        times.append(time.perf_counter() - t0)
    return min(times) / nbytes  # the least loaded of the repetitions, as STAT does


def _mu(nbytes: int = 8 << 20, reps: int = 15) -> float:
    """μ: seconds per byte one thread copies (what a shared-memory collective pays)."""
    import torch

    a = torch.ones(nbytes // 4)
    b = torch.empty_like(a)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        b.copy_(a)
        times.append(time.perf_counter() - t0)
    return min(times) / nbytes  # the least loaded of the repetitions, as _gamma


def _codec(entries: int = 1 << 20, reps: int = 5) -> tuple[float, float, float, float]:
    """One-bit codec time as a + b·density per gradient entry, for encode and for decode.

    Encoding scans every entry (threshold, residual) and codes each sent index; decoding
    decodes each index and adds its entry into the running sum (``add_into``, as the
    decentralized strategy does). Measured at two densities, the
    two terms separate: returns (encode per entry, decode per entry, encode per sent
    entry, decode per sent entry).
    """
    import torch

    from disttrain.compression.onebit import OneBit

    g = torch.randn(entries, generator=torch.Generator().manual_seed(0))
    per_entry: dict[float, tuple[float, float]] = {}
    total = torch.zeros(entries)
    for density in (0.001, 0.01):
        codec = OneBit(float(g.abs().quantile(1 - density)))
        enc, dec = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            payload, _ = codec.compress_and_decode(g)
            enc.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            codec.add_into(total, payload)
            dec.append(time.perf_counter() - t0)
        per_entry[density] = (min(enc) / entries, min(dec) / entries)
    (e1, d1), (e2, d2) = per_entry[0.001], per_entry[0.01]
    span = 0.01 - 0.001
    enc_sent, dec_sent = max(0.0, (e2 - e1) / span), max(0.0, (d2 - d1) / span)
    return (max(0.0, e1 - enc_sent * 0.001), max(0.0, d1 - dec_sent * 0.001), enc_sent, dec_sent)


def _compute_seconds(row: dict[str, Any]) -> float:
    ms = row["step_ms"]
    return float(ms.get("forward_backward", 0.0) + ms.get("optimizer", 0.0)) / 1e3


def calibrate(
    workers: int = 4,
    sizes: Sequence[str] = CAL_SIZES,
    algorithms: Sequence[str] = (),
    progress: bool = True,
) -> Calibration:
    """Run the benches on this machine (2..``workers`` ranks) and fit every constant.

    ``algorithms``: the allreduce algorithms measured; default: those whose class sets
    ``calibrates`` (ring, tree, star, alltoall: bandwidth- and latency-bound paths).
    """
    if not algorithms:
        from disttrain import collectives

        algorithms = [name for name, a in collectives.ALGORITHMS.items() if a.calibrates]

    def say(text: str) -> None:
        if progress:
            print(f"calibrate: {text}", flush=True)

    load_before = os.getloadavg()
    links = _measure_links(workers, sizes, algorithms, say)
    say("memory reduction and copy rates, one-bit codec")
    gamma, mu = _gamma(), _mu()
    enc, dec, enc_sent, dec_sent = _codec()
    comp = _measure_compute(workers, say)
    cal = Calibration(
        alpha=links.alpha,
        beta=links.beta,
        gamma=gamma,
        mu=mu,
        seconds_per_flop=comp.s_flop,
        seconds_per_param=comp.s_param,
        seconds_per_step=comp.s_step,
        seconds_per_encode=enc,
        seconds_per_decode=dec,
        seconds_per_encode_sent=enc_sent,
        seconds_per_decode_sent=dec_sent,
        cores=os.cpu_count() or 1,
        colocation=comp.colocation,
        loopback=links.loopback,
        shared_memory=links.shared_memory,
        source=f"calibrated on {os.uname().nodename} at {time.strftime('%Y-%m-%d %H:%M:%S')}",
        meta={
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "compute_points": comp.points,
            "step_overheads": comp.overheads,
            "params": comp.params,
            "stat": STAT,
            "rows": links.raw,
            "dp_step_seconds": comp.steps,
        },
    )
    return dataclasses.replace(cal, sync=fit_sync(cal, comp.steps))


@dataclasses.dataclass
class _Links:
    """The allreduce fits: per n the shared-host links, and the critical-path α, β at n = 2."""

    loopback: dict[str, list[float]]
    shared_memory: dict[str, list[float]]
    raw: dict[str, Any]
    alpha: float
    beta: float


def _measure_links(
    workers: int, sizes: Sequence[str], algorithms: Sequence[str], say: Callable[[str], None]
) -> _Links:
    """``bench allreduce`` at n = 2..workers ranks, over the sockets and over shared memory.

    Per n, each link is fitted to the rows' paths; at n = 2, α and β also by a
    relative least-squares fit of STAT against each path's steps and critical bytes.
    """
    loopback: dict[str, list[float]] = {}
    shared_memory: dict[str, list[float]] = {}
    shared = shared_memory_algorithms()
    raw: dict[str, Any] = {}
    for n in range(2, workers + 1):
        say(
            f"bench allreduce on {n} ranks ({', '.join(algorithms)}; {', '.join(sizes)}; "
            f"{', '.join(shared)} {', '.join(SHARED_MEMORY_SIZES)})"
        )
        rows = bench_allreduce_rows(n, sizes, algorithms)
        loopback[str(n)] = fit_shared_link(rows, n)
        raw[f"allreduce_{n}"] = [{k: r[k] for k in ("algorithm", "size", STAT)} for r in rows]
        shm_rows = bench_allreduce_rows(n, SHARED_MEMORY_SIZES, shared)
        shared_memory[str(n)] = fit_shm_link(shm_rows, n)
        raw[f"shm_{n}"] = [{k: r[k] for k in ("algorithm", "size", STAT)} for r in shm_rows]
        if n == 2:
            paths = [critical_path(r["algorithm"], r["size"], 2, 4) for r in rows]
            alpha, beta = nonneg_relative_lstsq(
                [[p.steps, p.critical_bytes] for p in paths], [r[STAT] for r in rows]
            )
    return _Links(loopback, shared_memory, raw, alpha, beta)


@dataclasses.dataclass
class _Compute:
    """The compute fits from ``bench dp``, with the points and step times they came from."""

    params: int
    points: list[tuple[float, float]]
    overheads: list[float]
    s_flop: float
    s_param: float
    s_step: float
    colocation: dict[str, float]
    steps: dict[int, float]


def _measure_compute(workers: int, say: Callable[[str], None]) -> _Compute:
    """``bench dp``: one rank at two batch sizes, then n = 2..workers ranks at CAL_BATCH each.

    step = samples·6·params·s_flop + params·s_param (:func:`fit_compute`); the
    trainer's fixed work is disttrain's one-rank step minus the same compute;
    colocation is n ranks' compute over one rank's, at least 1.
    """
    params, _ = mlp_params()
    say(f"bench dp, 1 rank, batch {CAL_BATCH} and {4 * CAL_BATCH} (mlp, {params:,} parameters)")
    points: list[tuple[float, float]] = []
    overheads: list[float] = []
    for batch in (CAL_BATCH, 4 * CAL_BATCH):
        one = bench_dp_rows(1, batch)
        compute = _compute_seconds(one["plain"])
        points.append((float(batch), compute))
        # disttrain's own one-rank step minus the same compute: the trainer's fixed work
        overheads.append(batch / one["disttrain-1"]["samples_per_second"] - compute)
    s_flop, s_param = fit_compute(points, params, 6.0 * params)
    s_step = max(0.0, statistics.median(overheads))
    base = points[0][1]
    colocation: dict[str, float] = {}
    steps: dict[int, float] = {}
    for n in range(2, workers + 1):
        say(f"bench dp, {n} ranks at {CAL_BATCH} samples each")
        row = bench_dp_rows(n, CAL_BATCH * n)["dp fusion=4 no-overlap"]
        colocation[str(n)] = max(1.0, _compute_seconds(row) / base)
        steps[n] = CAL_BATCH * n / row["samples_per_second"]
    return _Compute(params, points, overheads, s_flop, s_param, s_step, colocation, steps)


def loopback_network(cal: Calibration, n: int) -> costmodel.Network:
    """The link of ``n`` ranks sharing this host, as the calibration fitted it."""
    from disttrain.lab import costmodel

    a, d, b = cal.loopback_link(n)
    return costmodel.Network(alpha=a, beta=b, delta=d, shared_host=True, name=f"loopback {n}")


def mlp_buckets(fusion_mb: float) -> tuple[int, ...]:
    """The bench mlp's fusion buckets in bytes: gradients in reverse registration order,
    filled up to the cap, as the reducer does."""
    import torch

    from disttrain.dataparallel.fusion import MB, assign_by_size

    sizes = mlp_params()[1][::-1]
    groups = assign_by_size([torch.empty(s // 4) for s in sizes], int(fusion_mb * MB))
    return tuple(sum(sizes[i] for i in g) for g in groups)


def fit_sync(cal: Calibration, steps: dict[int, float]) -> dict[str, float]:
    """Per rank count, the measured data-parallel step (``bench dp``, fusion 4 MB, no
    overlap, CAL_BATCH samples a rank) minus what the model predicts for it without this
    term: the wait of a synchronous step beyond its compute and its collective."""
    from disttrain.lab import costmodel

    params, _ = mlp_params()
    out = {}
    for n, measured in steps.items():
        work = costmodel.Workload(
            params=params, batch_size=CAL_BATCH * n, ranks_per_host=n, buckets=mlp_buckets(4.0)
        )
        p = costmodel.predict("allreduce:native", work, n, loopback_network(cal, n), cal)
        out[str(n)] = max(0.0, measured - p.step_seconds)
    return out


def describe(cal: Calibration) -> str:
    """A few lines a person can read: each constant in its usual unit."""
    lines = [
        cal.source,
        f"link (n=2, critical path): α {cal.alpha * 1e6:.1f} us, "
        f"1/β {1 / cal.beta / 1e9 if cal.beta else float('inf'):.3g} GB/s",
        f"memory reduction: 1/γ {1 / cal.gamma / 1e9 if cal.gamma else float('inf'):.3g} GB/s, "
        f"copy: 1/μ {1 / cal.mu / 1e9 if cal.mu else float('inf'):.3g} GB/s",
        f"compute: {1 / cal.seconds_per_flop / 1e9 if cal.seconds_per_flop else float('inf'):.3g}"
        f" GFLOP/s forward+backward, {cal.seconds_per_param * 1e9:.3g} ns per parameter per step",
        f"framework work per step (data, zero_grad, hooks): {cal.seconds_per_step * 1e3:.3g} ms",
        f"one-bit codec: encode {cal.seconds_per_encode * 1e9:.3g} ns, "
        f"decode {cal.seconds_per_decode * 1e9:.3g} ns per entry, plus "
        f"{cal.seconds_per_encode_sent * 1e9:.3g} / {cal.seconds_per_decode_sent * 1e9:.3g} ns "
        "per entry sent",
    ]
    for n, (a, d, b) in sorted(cal.loopback.items()):
        rate = 1 / b / 1e9 if b else float("inf")
        lines.append(
            f"loopback, {n} ranks sharing {cal.cores} cores: α {a * 1e6:.1f} us/step, "
            f"δ {d * 1e6:.1f} us/message, 1/β {rate:.3g} GB/s over all ranks; "
            f"compute ×{cal.colocation.get(n, 1.0):.2f}, a step's wait beyond its allreduce "
            f"{cal.sync.get(n, 0.0) * 1e3:.3g} ms"
        )
    for n in sorted(cal.shared_memory, key=int):
        a, inner, m = cal.shm_constants(n)
        rate = 1 / m / 1e9 if m else float("inf")
        lines.append(
            f"shared memory, {n} ranks: α {a * 1e6:.1f} us/barrier ({inner * 1e6:.1f} between "
            f"pieces), 1/μ {rate:.3g} GB/s copied over all ranks"
        )
    return "\n".join(lines)
