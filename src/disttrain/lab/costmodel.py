"""An α–β cost model of one training step for every strategy, from 2 to 10,000 nodes.

Why it is built so: a step is compute plus the communication that is not hidden
behind it. Compute is measured (``disttrain advise --calibrate``): seconds per
flop of forward+backward and seconds per parameter of the optimizer step.
Communication is the α–β model (Hockney): a message costs α (latency and
per-message overhead), a byte β on a link, and a byte added into a sum γ in
memory. For an allreduce the bytes and messages come from each algorithm's own
``cost()``; :mod:`disttrain.lab.collective_paths` orders them into a critical
path. Data-parallel gradients travel in fusion buckets, one allreduce per
bucket, so the bucket size sets the number of latency terms per step.

The API (the compare report and scripts call it)::

    from disttrain.lab import costmodel
    from disttrain.lab.calibration import Calibration

    net = costmodel.Network(alpha=5e-6, beta=8 / 25e9)      # 5 us, 25 Gbit/s
    work = costmodel.Workload(params=25_000_000, batch_size=8192)
    cal = Calibration.load(path)                             # or Calibration.defaults()
    p = costmodel.predict("allreduce:ring", work, nodes=256, network=net, calibration=cal)
    p.step_seconds, p.compute_seconds, p.comm_seconds, p.bytes_per_rank, p.reason
    costmodel.rank(costmodel.DEFAULT_STRATEGIES, work, 256, net, cal)   # fastest first

Strategies (``predict``'s first argument):

- ``allreduce:ALG`` for ALG in ``disttrain.collectives.ALGORITHMS``: synchronous data
  parallelism; buckets of ``Workload.bucket_bytes`` (or ``Workload.buckets``); with
  ``Workload.overlap`` the buckets but the last hide behind backward (≈ 2/3 of compute).
- ``ps:sync`` / ``ps:async``: ``Workload.servers`` shards; a worker pushes S and pulls
  S; a server moves n·S/K each way per round. Sync waits for the round; async is bound
  by the slower of the worker's own loop and the servers' links.
- ``localsgd:H`` (or ``localsgd:H:ALG``): one parameter allreduce every H steps (ALG:
  the fastest by this model if not named). Convergence per step differs: not modelled.
- ``decentralized:DENSITY`` (``:ring`` for the two-neighbour gossip): Strom-style
  sparse updates, DENSITY of the entries sent with exp-Golomb coded gaps, to every peer
  in n−1 sequential rounds (or to 2 neighbours), plus encode/decode time per element
  and per sent element.

Pipelines are not modelled: their cost depends on per-layer activation sizes and the
stage balance, which a parameter count does not give (see docs/lab.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from disttrain import collectives
from disttrain.lab.collective_paths import Path, critical_path

if TYPE_CHECKING:
    from disttrain.lab.calibration import Calibration

__all__ = [
    "DEFAULT_STRATEGIES",
    "Network",
    "Prediction",
    "Workload",
    "allreduce_seconds",
    "bucket_sizes",
    "compressed_bytes",
    "compute_seconds",
    "predict",
    "rank",
]

#: The strategies ``disttrain advise`` ranks when none are named.
DEFAULT_STRATEGIES: tuple[str, ...] = (
    "allreduce:ring",
    "allreduce:halving_doubling",
    "allreduce:butterfly",
    "allreduce:tree",
    "allreduce:roundrobin",
    "allreduce:star",
    "allreduce:alltoall",
    "ps:sync",
    "ps:async",
    "localsgd:8",
    "localsgd:32",
    "decentralized:0.01",
    "decentralized:0.01:ring",
)


@dataclass(frozen=True)
class Network:
    """α seconds per message, β seconds per byte per link (full duplex), γ per byte reduced.

    ``shared_host``: all ranks on one host's cores (loopback); then an allreduce costs
    steps·α + (all ranks' messages)·δ + (all ranks' bytes)·β (see ``Path.shared_seconds``).
    """

    alpha: float
    beta: float
    gamma: float | None = None  # None: the calibration's memory γ
    name: str = ""
    shared_host: bool = False
    delta: float = 0.0


@dataclass(frozen=True)
class Workload:
    """What one step computes and sends. ``batch_size`` is the GLOBAL batch."""

    params: int
    batch_size: int
    bytes_per_param: int = 4  # gradients in fp32
    flops_per_sample: float | None = None  # None: 6·params (dense forward 2, backward 4)
    bucket_bytes: int = 4 << 20  # --fusion-mb 4 (0: one allreduce per tensor)
    buckets: tuple[int, ...] | None = None  # exact bucket sizes, when the model is known
    overlap: bool = False
    servers: int = 1
    ranks_per_host: int = 1  # > 1: ranks share a host's cores (loopback runs)

    @property
    def gradient_bytes(self) -> int:
        return self.params * self.bytes_per_param

    @property
    def flops(self) -> float:
        return self.flops_per_sample if self.flops_per_sample is not None else 6.0 * self.params


@dataclass(frozen=True)
class Prediction:
    """One strategy's predicted step on ``nodes`` ranks."""

    strategy: str
    nodes: int
    step_seconds: float
    compute_seconds: float
    comm_seconds: float  # exposed: what the step waits for beyond compute
    bytes_per_rank: int  # sent by the busiest rank per step (amortised for local SGD)
    messages_per_rank: float
    efficiency: float  # compute of one node at the same per-node batch / step
    bound: str  # "latency", "bandwidth", "reduction", "compute", "server", "encode"
    reason: str
    samples_per_second: float  # global batch / step
    note: str = ""


def bucket_sizes(total_bytes: int, bucket_bytes: int) -> list[int]:
    """Full buckets of ``bucket_bytes`` and the remainder (one bucket if fusion is off)."""
    if total_bytes <= 0:
        return []
    if bucket_bytes <= 0 or bucket_bytes >= total_bytes:
        return [total_bytes]
    full, rest = divmod(total_bytes, bucket_bytes)
    return [bucket_bytes] * full + ([rest] if rest else [])


def compute_seconds(work: Workload, nodes: int, cal: Calibration) -> float:
    """Forward+backward on this rank's share of the batch, plus the optimizer step."""
    local = work.batch_size / nodes
    seconds = local * work.flops * cal.seconds_per_flop + work.params * cal.seconds_per_param
    return seconds * cal.colocation_factor(work.ranks_per_host)


def _gamma(net: Network, cal: Calibration) -> float:
    return cal.gamma if net.gamma is None else net.gamma


def allreduce_seconds(
    algorithm: str, nbytes: int, nodes: int, net: Network, cal: Calibration, itemsize: int = 4
) -> tuple[float, Path]:
    """One allreduce of ``nbytes`` on ``nodes`` ranks: seconds and its critical path."""
    path = critical_path(algorithm, nbytes, nodes, itemsize)
    if net.shared_host:
        return path.shared_seconds(net.alpha, net.delta, net.beta), path
    return path.seconds(net.alpha, net.beta, _gamma(net, cal)), path


def _bound(terms: dict[str, float]) -> str:
    return max(terms, key=lambda k: terms[k])


def _describe(bound: str, path: Path, nbytes: int, count: int, net: Network) -> str:
    per = f" × {count} buckets" if count > 1 else ""
    if bound == "latency":
        return f"latency-bound: {path.latency_formula}{per} × α {net.alpha * 1e6:.3g} us"
    if bound == "bandwidth":
        return f"bandwidth-bound: {path.bandwidth_formula} (S = {_mb(nbytes)}){per}"
    return f"reduction-bound: {_mb(path.reduced_bytes * count)} added per step"


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.3g} MB"


def _allreduce(alg: str, work: Workload, n: int, net: Network, cal: Calibration) -> Prediction:
    compute = compute_seconds(work, n, cal)
    sizes = list(work.buckets) if work.buckets else bucket_sizes(work.gradient_bytes,
                                                                 work.bucket_bytes)  # fmt: skip
    gamma = _gamma(net, cal)
    total = 0.0
    last = 0.0
    terms = {"latency": 0.0, "bandwidth": 0.0, "reduction": 0.0}
    sent = 0
    msgs = 0
    biggest: Path | None = None
    for size in sizes:
        t, path = allreduce_seconds(alg, size, n, net, cal, work.bytes_per_param)
        total += t
        last = t
        sent += path.bytes_per_rank
        msgs += path.messages_per_rank
        if net.shared_host:
            terms["latency"] += path.steps * net.alpha + path.total_messages * net.delta
            terms["bandwidth"] += path.total_bytes * net.beta
        else:
            terms["latency"] += path.steps * net.alpha
            terms["bandwidth"] += path.critical_bytes * net.beta
            terms["reduction"] += path.reduced_bytes * gamma
        biggest = biggest if biggest and biggest.critical_bytes >= path.critical_bytes else path
    exposed = total
    if work.overlap:  # every bucket but the last can run during backward (2/3 of compute)
        exposed = max(last, total - compute * 2 / 3)
    bound = _bound(terms)
    reason = "one rank: nothing to send"
    if biggest is not None and n > 1:
        reason = _describe(bound, biggest, max(sizes), len(sizes), net)
    if exposed < 0.1 * compute:
        bound, reason = "compute", f"compute-bound; comm {reason}"
    return _finish(f"allreduce:{alg}", n, compute, exposed, sent, msgs, bound, reason, work, cal)


def _finish(name: str, n: int, compute: float, comm: float, sent: float, msgs: float,
            bound: str, reason: str, work: Workload, cal: Calibration,
            note: str = "") -> Prediction:  # fmt: skip
    step = compute + comm
    base = compute_seconds(replace(work, ranks_per_host=1), n, cal)
    eff = base / step if step > 0 else 1.0
    sps = work.batch_size / step if step > 0 else 0.0
    return Prediction(name, n, step, compute, comm, int(sent), msgs, eff, bound, reason, sps, note)


def _fastest_allreduce(work: Workload, n: int, net: Network, cal: Calibration) -> str:
    names = [a for a in collectives.ALGORITHMS if a != "native"]
    return min(names, key=lambda a: allreduce_seconds(a, work.gradient_bytes, n, net, cal)[0])


def _localsgd(opts: list[str], work: Workload, n: int, net: Network,
              cal: Calibration) -> Prediction:  # fmt: skip
    period = _int(opts[0] if opts else "", "localsgd period H")
    alg = opts[1] if len(opts) > 1 else _fastest_allreduce(work, n, net, cal)
    compute = compute_seconds(work, n, cal)
    t, path = allreduce_seconds(alg, work.gradient_bytes, n, net, cal, work.bytes_per_param)
    comm = t / period
    bound = (
        "compute"
        if comm < 0.1 * compute
        else ("latency" if path.steps * net.alpha > path.critical_bytes * net.beta else "bandwidth")
    )
    reason = (f"one {alg} allreduce of the parameters every {period} steps: "
              f"{_mb(path.bytes_per_rank / period)}/step")  # fmt: skip
    return _finish(f"localsgd:{period}:{alg}", n, compute, comm, path.bytes_per_rank / period,
                   path.messages_per_rank / period, bound, reason, work, cal,
                   note="changes convergence per step")  # fmt: skip


def _ps(mode: str, work: Workload, n: int, net: Network, cal: Calibration) -> Prediction:
    if mode not in ("sync", "async"):
        raise ValueError(f"ps mode {mode!r}: use ps:sync or ps:async")
    k = max(1, work.servers)
    s = work.gradient_bytes
    compute = compute_seconds(work, n, cal)
    # worker side: K messages of S/K out (push) and in (pull)
    worker = 2 * (k * net.alpha + s * net.beta)
    # server side per round: n messages of S/K in, sum them, n out; optimizer on P/K params
    server = (2 * (n * net.alpha + n * s / k * net.beta) + n * s / k * _gamma(net, cal)
              + work.params / k * cal.seconds_per_param)  # fmt: skip
    # async: no barrier, a worker's own loop unless the servers cannot keep up with n of them
    comm = max(worker, server) if mode == "sync" else max(worker, server - compute)
    bound = "server" if server >= worker else "bandwidth"
    reason = (f"server link: n·S/K = {_mb(n * s / k)} each way per round (K={k})"
              if bound == "server" else f"worker link: 2S = {_mb(2 * s)} per step")  # fmt: skip
    if comm < 0.1 * compute:
        bound, reason = "compute", "compute-bound; " + reason
    note = "stale gradients" if mode == "async" else ""
    return _finish(f"ps:{mode}", n, compute, max(comm, 0.0), 2 * s, 2 * k, bound, reason,
                   work, cal, note)  # fmt: skip


def compressed_bytes(params: int, density: float) -> int:
    """Bytes of one Strom-style payload: exp-Golomb gaps (≈ 2·log2(1/d)+1 bits) + a sign bit."""
    kept = params * density
    bits = 2 * math.log2(1 / density) + 1 + 1 if density < 1 else 33
    return math.ceil(kept * bits / 8) + 4  # + the int32 length prefix


def _decentralized(opts: list[str], work: Workload, n: int, net: Network,
                   cal: Calibration) -> Prediction:  # fmt: skip
    density = _float(opts[0] if opts else "0.01", "decentralized density")
    ring = len(opts) > 1 and opts[1] == "ring"
    peers = min(2, n - 1) if ring else n - 1
    payload = compressed_bytes(work.params, density)
    compute = compute_seconds(work, n, cal)
    # each round: the length then the payload, both ways at once; rounds in sequence
    latency = 2 * peers * net.alpha
    bandwidth = peers * payload * net.beta
    # encode scans every entry and codes the sent ones; each peer's payload is decoded alike
    sent = work.params * density
    encode = work.params * cal.seconds_per_encode + sent * cal.seconds_per_encode_sent
    decode = work.params * cal.seconds_per_decode + sent * cal.seconds_per_decode_sent
    coding = encode + peers * decode
    comm = latency + bandwidth + coding
    terms = {"latency": latency, "bandwidth": bandwidth, "encode": coding}
    bound = _bound(terms)
    what = "2 neighbours" if ring else f"n−1 = {peers} peers"
    reason = {
        "latency": f"latency-bound: 2 messages to each of {what} × α",
        "bandwidth": f"bandwidth-bound: {_mb(payload)} to each of {what}",
        "encode": f"codec-bound: 1 encode and {peers} decodes of {work.params:,} entries, "
        f"{sent:,.0f} sent",
    }[bound]
    if comm < 0.1 * compute:
        bound, reason = "compute", "compute-bound; " + reason
    name = f"decentralized:{density:g}" + (":ring" if ring else "")
    note = "gossip: replicas differ" if ring else "sparse, error feedback"
    return _finish(name, n, compute, comm, peers * payload, 2 * peers, bound, reason, work,
                   cal, note)  # fmt: skip


def _int(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{what}: expected a whole number, got {text!r}") from None
    if value < 1:
        raise ValueError(f"{what}: must be at least 1, got {value}")
    return value


def _float(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what}: expected a number, got {text!r}") from None
    if not 0 < value <= 1:
        raise ValueError(f"{what}: must be in (0, 1], got {value}")
    return value


def predict(
    strategy: str, work: Workload, nodes: int, network: Network, calibration: Calibration
) -> Prediction:
    """The predicted step of ``strategy`` (see the module docstring) on ``nodes`` ranks."""
    if nodes < 1:
        raise ValueError(f"nodes must be at least 1, got {nodes}")
    kind, *opts = strategy.split(":")
    if kind == "allreduce":
        alg = opts[0] if opts else "native"
        if alg not in collectives.ALGORITHMS:
            raise ValueError(
                f"unknown allreduce algorithm {alg!r}: {', '.join(collectives.ALGORITHMS)}"
            )
        return _allreduce(alg, work, nodes, network, calibration)
    if kind == "ps":
        return _ps(opts[0] if opts else "sync", work, nodes, network, calibration)
    if kind == "localsgd":
        return _localsgd(opts, work, nodes, network, calibration)
    if kind == "decentralized":
        return _decentralized(opts, work, nodes, network, calibration)
    raise ValueError(f"unknown strategy {strategy!r}: allreduce:ALG, ps:sync|async, "
                     "localsgd:H, decentralized:DENSITY[:ring]")  # fmt: skip


def rank(
    strategies: tuple[str, ...] | list[str],
    work: Workload,
    nodes: int,
    network: Network,
    calibration: Calibration,
) -> list[Prediction]:
    """Every strategy's prediction, fastest step first."""
    preds = [predict(s, work, nodes, network, calibration) for s in strategies]
    return sorted(preds, key=lambda p: p.step_seconds)
