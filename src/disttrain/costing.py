"""The α–β cost model's parts that every strategy's ``predict`` uses (below the strategies).

A step is compute plus the communication that is not hidden behind it. Compute is
measured (``disttrain advise --calibrate``): seconds per flop of forward+backward and
seconds per parameter of the optimizer step. Communication is the α–β model (Hockney):
a message costs α (latency and per-message overhead), a byte β on a link, and a byte
added into a sum γ in memory. For an allreduce the bytes and messages come from each
algorithm's own ``cost()``, ordered into a critical path.

Each strategy's cost part holds its own formula (``StrategyCost.predict``); this module holds
what they share: the inputs (:class:`Network`, :class:`Workload`), the output
(:class:`Prediction`) and the common terms. ``disttrain.lab.costmodel`` is the
public entry point (it looks the strategy up by name).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, Protocol

from disttrain import collectives
from disttrain.collectives.costs import Path
from disttrain.collectives.paths import critical_path

__all__ = [
    "CAST_BYTES",
    "STATE_COPIES",
    "CriticalPath",
    "Memory",
    "Network",
    "NotModelled",
    "Prediction",
    "Question",
    "Rates",
    "Workload",
    "allreduce_path",
    "allreduce_seconds",
    "allreduce_table",
    "auto_candidates",
    "bound_of",
    "bucket_sizes",
    "compressed_bytes",
    "compute_seconds",
    "describe_allreduce",
    "fastest_allreduce",
    "finish",
    "gamma_of",
    "mb",
    "worker_memory",
]


class Rates(Protocol):
    """The calibrated constants a prediction reads (``disttrain.calibration.Calibration``)."""

    @property
    def gamma(self) -> float: ...  # seconds per byte added in memory
    @property
    def mu(self) -> float: ...  # seconds per byte copied by one thread (shared memory)
    @property
    def seconds_per_flop(self) -> float: ...
    @property
    def seconds_per_param(self) -> float: ...
    @property
    def seconds_per_step(self) -> float: ...  # framework work per step (data, hooks, meters)
    @property
    def seconds_per_encode(self) -> float: ...
    @property
    def seconds_per_decode(self) -> float: ...
    @property
    def seconds_per_encode_sent(self) -> float: ...
    @property
    def seconds_per_decode_sent(self) -> float: ...
    def colocation_factor(self, ranks_per_host: int) -> float: ...
    # what a step ending in a collective over this many ranks waits beyond the collective
    # (the slowest rank's lateness, bucket copies, cold caches): charged once per step by
    # the strategies that synchronise every step (allreduce, zero)
    def sync_seconds(self, ranks: int) -> float: ...
    def shm_link(self, ranks: int) -> tuple[float, float, float] | None: ...  # (α, inner α, μ)
    # the link between hosts (α per message, β per byte) and over loopback (α, δ, β)
    @property
    def alpha(self) -> float: ...
    @property
    def beta(self) -> float: ...
    def loopback_link(self, ranks: int) -> tuple[float, float, float]: ...


#: One allreduce's critical path, as each algorithm states it.
CriticalPath = Path


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


class Question(NamedTuple):
    """What a strategy's cost part is asked, the one ``predict`` header: the run (``spec``, a
    ``RunSpec``) doing ``work`` on ``nodes`` ranks of ``network``, at ``calibration``'s rates.
    It unpacks: ``spec, work, nodes, network, calibration = q``."""

    spec: Any
    work: Workload
    nodes: int
    network: Network
    calibration: Rates


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
    optimizer: str = "momentum"  # the memory formulas: its state (STATE_COPIES)
    precision: str = "fp32"  # the memory formulas: autocast's weight copies (CAST_BYTES)
    #: each layer's parameter count, when the model is known (a pipeline's --balance list)
    layer_params: tuple[int, ...] | None = None
    #: the module path each of those layers starts at (a pipeline's --split-points name them)
    layer_paths: tuple[str, ...] | None = None
    # the parameter tensors' shapes, when the model is known: what a per-layer compressor
    # (PowerSGD's rank-r factors) sends depends on them, not on the count alone
    shapes: tuple[tuple[int, ...], ...] | None = None

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


class NotModelled(ValueError):
    """A strategy without a step-time formula (its ``not_modelled`` says why)."""


#: fp32 tensors of optimizer state per parameter: torch's SGD keeps none, momentum one
#: buffer, Adam two moments (tests/lab/test_memory_model.py counts torch's own).
STATE_COPIES = {"sgd": 0, "momentum": 1, "adam": 2}
#: Bytes per weight of the copies autocast makes for bf16/fp16 matmuls. Parameters,
#: gradients and optimizer state stay fp32 at every --precision (disttrain.amp: fp32
#: master weights), but autograd keeps each cast weight for backward, so a worker holds
#: 2 bytes per weight it computes with from its forward to its backward (tested).
CAST_BYTES = {"fp32": 0, "bf16": 2, "fp16": 2}
FP32 = 4


@dataclass(frozen=True)
class Memory:
    """Predicted bytes one worker holds (the fullest one where they differ): the counted
    figures of ``memory_per_rank`` (``parameters``, ``gradients``, ``optimizer_state``,
    ``gathered``: ZeRO stage 3's gathered layers) plus autocast's weight copies."""

    parameters: float
    gradients: float
    optimizer_state: float
    gathered: float = 0.0
    cast_copies: float = 0.0
    note: str = ""

    @property
    def held(self) -> float:
        """What stays between steps: parameters, gradients and optimizer state."""
        return self.parameters + self.gradients + self.optimizer_state

    @property
    def total(self) -> float:
        """The most at once within a step (activations aside): held + gathered + casts."""
        return self.held + self.gathered + self.cast_copies


def worker_memory(
    work: Workload,
    params: float,
    grads: float | None = None,
    state: float | None = None,
    gathered: float = 0.0,
    computed: float | None = None,
    note: str = "",
) -> Memory:
    """Bytes of a worker holding ``params`` parameters, the gradients of ``grads`` and the
    optimizer state of ``state`` of them (each default: ``params``), ``gathered`` more
    parameters at once, and computing with the weights of ``computed`` (default ``params``)."""
    grads = params if grads is None else grads
    state = params if state is None else state
    computed = params if computed is None else computed
    return Memory(
        FP32 * params,
        FP32 * grads,
        FP32 * STATE_COPIES[work.optimizer] * state,
        FP32 * gathered,
        CAST_BYTES[work.precision] * computed,
        note,
    )


def bucket_sizes(total_bytes: int, bucket_bytes: int) -> list[int]:
    """Full buckets of ``bucket_bytes`` and the remainder (one bucket if fusion is off)."""
    if total_bytes <= 0:
        return []
    if bucket_bytes <= 0 or bucket_bytes >= total_bytes:
        return [total_bytes]
    full, rest = divmod(total_bytes, bucket_bytes)
    return [bucket_bytes] * full + ([rest] if rest else [])


def compute_seconds(work: Workload, nodes: int, cal: Rates) -> float:
    """Forward+backward on this rank's share of the batch, the optimizer step, the step's
    fixed framework work; all slowed by the ranks sharing the host's cores."""
    local = work.batch_size / nodes
    seconds = local * work.flops * cal.seconds_per_flop + work.params * cal.seconds_per_param
    seconds += cal.seconds_per_step
    return seconds * cal.colocation_factor(work.ranks_per_host)


def gamma_of(net: Network, cal: Rates) -> float:
    """γ: the network's own if given, else the calibrated memory γ."""
    return cal.gamma if net.gamma is None else net.gamma


def allreduce_path(algorithm: str, nbytes: int, n: int, itemsize: int = 4) -> CriticalPath:
    """The critical path of one allreduce of ``nbytes`` on ``n`` ranks with ``algorithm``
    (an unknown name raises the collectives' own error)."""
    return critical_path(algorithm, nbytes, n, itemsize)


def allreduce_seconds(
    algorithm: str, nbytes: int, nodes: int, net: Network, cal: Rates, itemsize: int = 4
) -> tuple[float, CriticalPath]:
    """One allreduce of ``nbytes`` on ``nodes`` ranks: seconds and its critical path. An
    algorithm that chooses per size (``auto``) is priced as what it would choose here: the
    fastest candidate (:func:`auto_candidates`)."""
    if isinstance(collectives.get(algorithm), collectives.Chooses):
        names = auto_candidates(net.shared_host)
        algorithm = _fastest(names, nbytes, nodes, net, cal, itemsize)
    path = allreduce_path(algorithm, nbytes, nodes, itemsize)
    if net.shared_host:
        # through shared memory, a step is a barrier and a copy shares the cores: their own
        # fitted constants where calibrated (Calibration.shared_memory)
        link = cal.shm_link(nodes) if path.total_copied else None
        step, inner, mu = link if link else (net.alpha, net.alpha, cal.mu)
        return path.shared_seconds(step, net.delta, net.beta, mu, inner), path
    return path.seconds(net.alpha, net.beta, gamma_of(net, cal), cal.mu), path


def fastest_allreduce(work: Workload, n: int, net: Network, cal: Rates) -> str:
    """The algorithm this model predicts fastest for one allreduce of the gradients."""
    # an estimated algorithm (native: gloo's own ring) is modelled as another, never a choice;
    # a one-host algorithm (shm) only for ranks that share a host; a composite one
    # (hierarchical) never: its path follows the launch's hosts layout, which a Network does
    # not describe (read from the environment, it priced every rank as on one host: 0 bytes)
    names = [
        a
        for a, algo in collectives.ALGORITHMS.items()
        if not algo.estimated and not algo.composite and (net.shared_host or not algo.one_host)
    ]
    return min(names, key=lambda a: allreduce_seconds(a, work.gradient_bytes, n, net, cal)[0])


def auto_candidates(shared_host: bool) -> list[str]:
    """What ``--algorithm auto`` chooses from: every registered algorithm that is not built
    of others (nor a chooser), the one-host ones only for ranks sharing a host; the backend's
    own (its kind ``estimated``: native, gloo's ring in C++, priced as the path it documents)
    first, so that it wins a tie (``min`` keeps the first)."""
    names = [
        name
        for name, kind in collectives.ALGORITHMS.items()
        if not kind.composite and (shared_host or not kind.one_host)
    ]
    return sorted(names, key=lambda name: not collectives.ALGORITHMS.get(name).estimated)


def _fastest(names: list[str], nbytes: int, n: int, net: Network, cal: Rates, itemsize: int) -> str:
    return min(names, key=lambda x: allreduce_seconds(x, nbytes, n, net, cal, itemsize)[0])


#: The message sizes ``--algorithm auto``'s table is chosen at: 1 KB to 256 MB, doubling (a
#: size between two is run by the algorithm of the larger: the table's bound is inclusive).
TABLE_SIZES = tuple(1 << k for k in range(10, 29))


def allreduce_table(n: int, hosts: int, cal: Rates, itemsize: int = 4) -> str:
    """``--algorithm auto``'s table for ``n`` ranks on ``hosts`` hosts, ``SIZE:NAME,...,*:NAME``
    (:mod:`disttrain.collectives.auto`): at each of :data:`TABLE_SIZES`, the registered
    algorithm this model predicts fastest, as NCCL's tuner picks ring or tree by size.

    - one host: every algorithm that runs between ranks of one host (``shm`` too), priced on
      the loopback link and the shared-memory constants ``cal`` fitted;
    - several hosts with several ranks each: the algorithm whose path follows the hosts
      (its kind's ``follows_hosts``: ``hierarchical``, shared memory inside each host, one
      leader a host across), which this flat model does not price (:func:`fastest_allreduce`
      leaves it out for that reason); the backend's own where none is registered;
    - one rank a host: the network algorithms on the calibration's α and β.
    ``native`` (gloo's ring in C++, priced as the path it documents) wins a tie.
    """
    if n <= 1:  # nothing to send: any will do, the backend's own
        return f"*:{auto_candidates(False)[0]}"
    if 1 < hosts < n:
        spans = [k.name for _, k in collectives.ALGORITHMS.items() if k.follows_hosts]
        return f"*:{(spans or auto_candidates(False))[0]}"
    shared = hosts <= 1
    a, d, b = cal.loopback_link(n) if shared else (cal.alpha, 0.0, cal.beta)
    net = Network(alpha=a, beta=b, delta=d, shared_host=shared, name="auto")
    names = auto_candidates(shared)
    picks = [_fastest(names, size, n, net, cal, itemsize) for size in TABLE_SIZES]
    rows = [
        f"{size}:{name}"
        for size, name, after in zip(TABLE_SIZES, picks, [*picks[1:], None], strict=True)
        if name != after and after is not None
    ]
    return ",".join([*rows, f"*:{picks[-1]}"])


def bound_of(terms: dict[str, float]) -> str:
    """The name of the largest term."""
    return max(terms, key=lambda k: terms[k])


def mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.3g} MB"


def describe_allreduce(
    bound: str, path: CriticalPath, nbytes: int, count: int, net: Network
) -> str:
    """Why an allreduce of ``count`` buckets takes what it takes, with its formula."""
    per = f" × {count} buckets" if count > 1 else ""
    if bound == "latency":
        return f"latency-bound: {path.latency_formula}{per} × α {net.alpha * 1e6:.3g} us"
    if bound == "bandwidth":
        return f"bandwidth-bound: {path.bandwidth_formula} (S = {mb(nbytes)}){per}"
    return f"reduction-bound: {mb(path.reduced_bytes * count)} added per step"


def compressed_bytes(params: int, density: float, value_bits: int = 1) -> int:
    """Bytes of one sparse payload: exp-Golomb gaps (≈ 2·log2(1/d)+1 bits) + each value.

    Strom's one-bit sends a sign bit per entry (``value_bits`` 1), top-k the fp32 value (32).
    """
    kept = params * density
    bits = 2 * math.log2(1 / density) + 1 + value_bits if density < 1 else 32 + value_bits
    return math.ceil(kept * bits / 8) + 4  # + the int32 length prefix


#: a step whose exposed communication is under this share of its compute is compute-bound
COMPUTE_BOUND = 0.1


def finish(
    name: str,
    n: int,
    compute: float,
    comm: float,
    sent: float,
    msgs: float,
    bound: str,
    reason: str,
    work: Workload,
    cal: Rates,
    note: str = "",
) -> Prediction:
    """The prediction of a step of ``compute`` + exposed ``comm`` seconds. Under
    :data:`COMPUTE_BOUND` of the compute, the step is compute-bound whatever term the
    strategy found largest (its reason follows "compute-bound; ")."""
    if comm < COMPUTE_BOUND * compute and bound != "compute":
        bound, reason = "compute", f"compute-bound; {reason}"
    step = compute + comm
    base = compute_seconds(replace(work, ranks_per_host=1), n, cal)
    eff = base / step if step > 0 else 1.0
    sps = work.batch_size / step if step > 0 else 0.0
    return Prediction(name, n, step, compute, comm, int(sent), msgs, eff, bound, reason, sps, note)
