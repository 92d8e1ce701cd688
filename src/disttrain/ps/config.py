"""The parameter server's settings (``--servers``, ``--ps-mode``, ...): flags and TOML keys."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from disttrain.comm.errors import UsageError
from disttrain.config import TrainConfig, opt, register_section
from disttrain.ps.auth import CurveKey, read_key
from disttrain.ps.consistency import MODES

__all__ = ["ASYNCHRONOUS", "LOOPBACK", "PSConfig", "parse_straggler", "push_lr_share"]

LOOPBACK = ("127.0.0.1", "localhost", "::1")


#: The modes whose updates are stale by design (every worker's gradient applied alone).
ASYNCHRONOUS = ("async", "ssp")


def push_lr_share(mode: str, workers: int, share: bool = True) -> float:
    """The factor on the learning rate of each update the servers apply: 1/N in async and
    ssp, where every worker's gradient (of B/N samples) is applied alone; 1 elsewhere.

    A synchronous step moves lr·mean(g_1..g_N) = Σ (lr/N)·g_i: applying each push at
    lr/N is the same step in N parts (the linear scaling rule for a batch of B/N, Goyal
    et al. 2017), with the same momentum. At the full lr the N parts would move N× as
    far. Measured on the default workload (mlp on digits, 2 workers, 5 epochs; sync
    0.958): lr/N with momentum 0.9, async 0.953 0.958 0.953 0.961 0.964, ssp 0.931 0.944
    0.911 0.950 0.953; the rule this replaces (full lr, momentum 1 − N²(1 − μ) after
    Mitliagkas et al. 2016: half the effective step) async 0.950 0.908 0.947, ssp 0.936
    0.931 0.908 (benchmarks/RESULTS.md, "Defaults that train").

    Adam is not linear: each push's step is about lr long whatever its batch. 1/√N for
    an adaptive optimizer was tried on tests/api/test_every_strategy.py's regression (3
    workers, Adam 0.01, 80 steps; held-out MSE / allreduce's, model seeds 0-4, 2026-12-02)
    and not adopted: async median 1.72 over 16 runs against 1.92 over 13 at 1/N, ssp 1.78
    against 2.10, but 2 runs of each beyond 10x (async 11.9, 13.1; ssp 13.3, 19.6), none
    at 1/N; the arrival order makes runs of one seed differ (async at seed 0: 1.66 and
    11.9), so no seed-by-seed gain shows.

    ``--staleness-lr`` redistributes the share by staleness (ps/consistency.py
    RelativeStaleness): each push at lr/N times its 1/σ over the shard's recent mean 1/σ,
    so stale pushes move less and fresh ones more while the mean step stays lr/N, however
    loaded the machine. Issue 51's command (4 workers, a 4× straggler, 6 epochs, seeds 3-5;
    benchmarks/ps_seeds.py, RESULTS "Parameter server"): lr/(N·σ), the two compounded, gave
    0.925 0.939 0.953 quiet against sync's 0.953 0.961 0.961 (7953e44); lr/σ alone 0.956
    0.958 0.961 quiet but 0.936 0.944 0.947 beside two busy processes, its steps shrinking
    as the load made every gradient staler (9e31aeb).
    """
    if mode not in ASYNCHRONOUS or not share:
        return 1.0
    return 1.0 / workers


def parse_straggler(spec: str) -> tuple[int, float] | None:
    """``"3:4"`` -> (rank 3, factor 4.0); empty -> None."""
    if not spec:
        return None
    rank, sep, factor = spec.partition(":")
    try:
        if not sep:
            raise ValueError
        r, f = int(rank), float(factor)
    except ValueError:
        raise UsageError(f"--straggler {spec!r}: use RANK:FACTOR, e.g. 3:4") from None
    if r < 0 or f < 1.0:
        raise UsageError(f"--straggler {spec!r}: RANK must be >= 0 and FACTOR >= 1")
    return r, f


@register_section
@dataclass(frozen=True)
class PSConfig:
    """Settings of ``--strategy ps``."""

    servers: int = opt(1, "ps: parameter-server processes on this node")
    ps_mode: str = opt("sync", "ps: when gradients are applied", MODES)
    staleness_bound: int = opt(2, "ps ssp: most steps a worker may run ahead of the slowest")
    softsync: int = opt(0, "ps softsync: gradients averaged into each update (0: all workers)")
    staleness_lr: bool = opt(
        False,
        "ps: divide each update's learning rate by its staleness (async and ssp: relative "
        "to the shard's recent mean, so the mean step stays --push-lr-share's)",
    )
    push_lr_share: bool = opt(
        True,
        "ps async/ssp: apply each push at lr/workers, its share of the global batch "
        "(linear scaling); off: at the full lr",
    )
    straggler: str = opt("", "ps: slow worker RANK by FACTOR, RANK:FACTOR (sleeps (F-1) x step)")
    ps_address: str = opt("127.0.0.1", "ps: address the servers listen on")
    ps_heartbeat: float = opt(0.5, "ps: seconds between a worker's heartbeats")
    ps_worker_timeout: float = opt(10.0, "ps: seconds of silence before a worker is lost")
    # security (docs/parameter-server.md): CURVE on the servers' ZeroMQ sockets
    ps_curve_key: str = opt("", "ps: CURVE secret-key file; authenticates and encrypts PS traffic")

    def validate(self) -> None:
        if self.servers <= 0:
            raise UsageError(f"--servers must be positive, got {self.servers}")
        if self.staleness_bound < 0:
            raise UsageError(f"--staleness-bound must be >= 0, got {self.staleness_bound}")
        if self.softsync < 0:
            raise UsageError(f"--softsync must be >= 0, got {self.softsync}")
        if self.ps_heartbeat <= 0:
            raise UsageError(f"--ps-heartbeat must be positive, got {self.ps_heartbeat}")
        if self.ps_worker_timeout <= 2 * self.ps_heartbeat:
            raise UsageError(
                f"--ps-worker-timeout {self.ps_worker_timeout} must exceed two heartbeats "
                f"(2 x {self.ps_heartbeat} s)"
            )
        if not self.ps_address:
            raise UsageError("--ps-address must not be empty (default 127.0.0.1)")
        parse_straggler(self.straggler)
        self.curve_key()

    def curve_key(self) -> CurveKey | None:
        """The job's CURVE key pair from ``--ps-curve-key``, or None without one."""
        return read_key(self.ps_curve_key) if self.ps_curve_key else None

    def validate_with(self, train: TrainConfig) -> None:
        """Checks that need the worker count."""
        workers = train.world_size
        if self.softsync > workers:
            raise UsageError(f"--softsync {self.softsync} exceeds the {workers} workers")
        if train.precision == "fp16" and train.strategy == "ps" and self.ps_mode != "sync":
            # the loss scale is agreed by a collective over the workers every step
            raise UsageError("--precision fp16 with --strategy ps needs --ps-mode sync; use bf16")
        if (
            train.strategy == "ps"
            and self.ps_mode != "sync"
            and (train.checkpoint_every or train.resume)
        ):
            # the servers' state matches no single step of every worker outside sync mode
            raise UsageError(
                f"--checkpoint-every and --resume with --strategy ps need --ps-mode sync "
                f"(got {self.ps_mode})"
            )
        if train.strategy == "ps" and not self.ps_curve_key and self.ps_address not in LOOPBACK:
            sys.stderr.write(
                f"disttrain: warning: --ps-address {self.ps_address} without --ps-curve-key: "
                "anyone who can reach the servers can push gradients\n"
            )
        straggler = parse_straggler(self.straggler)
        if straggler and straggler[0] >= workers:
            raise UsageError(
                f"--straggler names rank {straggler[0]}, but workers are ranks 0..{workers - 1}"
            )
