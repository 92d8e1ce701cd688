"""``--strategy ps``: workers push gradients to sharded parameter servers and pull weights.

Ranks [0, N) are workers, ranks [N, N+K) are servers, all in one job started
by the same launcher. Servers bind ZeroMQ sockets on 127.0.0.1 (or
``--ps-address``) at ephemeral ports and publish them through the job's
torch.distributed store. Server k owns elements [lo_k, hi_k) of the flattened
parameters and their optimizer state (the user's optimizer class and
settings, rebuilt on the flat shard).

The trainer's optimizer does nothing on a worker, without being replaced (its
learning rate, which the trainer's schedule sets, travels with each push):
``after_backward`` sends the gradients, copies the weights the servers answer
with into the model and clears every ``.grad``; ``optimizer.step()`` skips
parameters without a gradient, so it leaves the servers' weights untouched
and never allocates optimizer state on workers.

In async, ssp and softsync modes the run's work is a budget of gradients
(steps x N, the same samples as a synchronous run) shared by the workers: fast
workers run more steps than slow ones, and every worker stops when the
servers say the budget is spent (``limits`` and ``should_stop`` of the layout,
:class:`ServerLayout`).
"""

from __future__ import annotations

import itertools
import socket
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup

from disttrain import checkpoint, timeline
from disttrain.comm.errors import UsageError
from disttrain.comm.forming import new_group
from disttrain.comm.world import group_timeout
from disttrain.config import RunConfig
from disttrain.dataparallel.broadcast import broadcast_tensors
from disttrain.dataparallel.buffers import average_buffers, integer_buffers
from disttrain.ps.client import PSClient
from disttrain.ps.config import ASYNCHRONOUS, PSConfig, parse_straggler, push_lr_share
from disttrain.ps.consistency import MODES, Consistency
from disttrain.ps.server import ShardServer, bind_router
from disttrain.ps.sharding import flatten, shard_bounds, unflatten_into
from disttrain.strategies.base import Strategy, register
from disttrain.strategies.capabilities import Reshards, ShardsData, StepEvents
from disttrain.strategies.layout import Layout
from disttrain.strategies.settings import StrategySettings

__all__ = ["PSSettings", "ParameterServer", "ServerLayout"]

_KEY = "disttrain/ps/endpoint/{}/{}"  # (the job's parameter-server generation, shard)
#: parameter servers this process has set up: every process of a job sets up the same
#: ones in the same order (a script may call dt.distribute twice in one process group),
#: so the count names this generation's endpoints and no worker reads an earlier one's
_GENERATIONS = itertools.count()
_SERVER_KEYS = (
    "rank",
    "shard",
    "elements",
    "bytes_in",
    "bytes_out",
    "messages_in",
    "messages_out",
    "discarded_after_stop",
)


def _publish_host(address: str) -> str:
    """The host workers should dial for a server bound to ``address``."""
    return socket.gethostname() if address in ("0.0.0.0", "::", "*") else address


class PSSettings(StrategySettings):
    """What the parameter servers read (their section), and softsync's own lr default."""

    main_setting: ClassVar[str | None] = "ps_mode"
    modes: ClassVar[dict[str, tuple[str, ...]]] = {m: ("--ps-mode", m) for m in MODES}
    reads_settings = (PSConfig,)

    @classmethod
    def settings_not_read(cls, config: RunConfig) -> dict[str, str]:
        mode = config.section(PSConfig).ps_mode
        unread: dict[str, str] = {}
        if mode != "ssp":
            unread["staleness_bound"] = f"with --ps-mode {mode} (only ssp bounds staleness)"
        if mode != "softsync":
            unread["softsync"] = f"with --ps-mode {mode}"
        if mode == "sync":
            unread["staleness_lr"] = "with --ps-mode sync (no update is stale)"
        if mode not in ASYNCHRONOUS:
            unread["push_lr_share"] = f"with --ps-mode {mode} (only async and ssp)"
        return unread

    @classmethod
    def defaults_for(cls, settings: Mapping[str, Any]) -> dict[str, Any]:
        # softsync as Zhang et al. 2016 run it: each update's lr divided by the mean
        # staleness of the gradients it averages (ps/consistency.py staleness_lr_scale).
        # On the default workload it keeps quiet runs in the defaults band where the full
        # lr did not, but not runs on a busy machine, so the defaults test runs softsync's
        # row without enforcing it (benchmarks/RESULTS.md, "Defaults that train")
        defaults = super().defaults_for(settings)
        if settings.get("ps_mode") == "softsync":
            defaults["staleness_lr"] = True
        return defaults

    @classmethod
    def validate_config(cls, config: RunConfig, model: nn.Module) -> None:
        super().validate_config(config, model)
        config.section(PSConfig).validate_with(config.train)


class ServerLayout(Layout):
    """Ranks [0, N) train, ranks [N, N+K) serve; async modes may lose a worker but rank 0."""

    strategy: ParameterServer

    @classmethod
    def num_processes(cls, config: RunConfig) -> int:
        ps: PSConfig = config.section(PSConfig)
        return config.train.workers + ps.servers

    @classmethod
    def survives_loss_of(cls, config: RunConfig, rank: int) -> bool:
        # Rank 0 writes the summary, so its loss always ends the job; sync mode cannot go on.
        ps: PSConfig = config.section(PSConfig)
        return ps.ps_mode != "sync" and 0 < rank < config.train.world_size

    @property
    def is_worker(self) -> bool:
        return self.strategy.world.rank < self.strategy.n_workers

    @property
    def worker_group(self) -> ProcessGroup | None:
        return self.strategy.workers_group

    def serve(self) -> dict[str, Any]:
        assert self.strategy.server is not None
        return self.strategy.server.run()

    def limits(self, epochs: int, steps: int) -> tuple[int, int]:
        ps = self.strategy
        assert ps.client is not None
        with torch.no_grad():
            unflatten_into(ps.client.hello(steps), ps.params)
        if ps.ps.ps_mode == "sync":
            return epochs, steps
        return epochs * ps.n_workers, steps * ps.n_workers  # one worker could do it all

    def should_stop(self) -> bool:
        return self.strategy.client is not None and self.strategy.client.stop


# ShardsData: only the workers (ranks below --workers) split each global batch.
# StepEvents: the step's number travels with the push; a skipped step is said to the servers.
# Reshards: workers hold pulled replicas (equal), so another worker count resumes them as
# they are; each server keeps its shard (saved by shard index, not rank) and adapts its clocks.
@register(settings=PSSettings, cost="disttrain.strategies.cost.ps:PSCost", layout=ServerLayout)
class ParameterServer(Strategy, ShardsData, StepEvents, Reshards):
    """Sharded parameter servers in sync, async, ssp or softsync mode."""

    name = "ps"

    def __init__(self, config: RunConfig, world: Any, loss_fn: Any) -> None:
        super().__init__(config, world, loss_fn)
        self.ps: PSConfig = config.section(PSConfig)
        self.n_workers = config.train.world_size
        self.n_servers = self.ps.servers * config.train.nnodes
        self.straggler = parse_straggler(self.ps.straggler)
        self.workers_group: ProcessGroup | None = None
        self.client: PSClient | None = None
        self.server: ShardServer | None = None
        self.stats: list[dict[str, Any]] = []
        self._last_start: float | None = None
        self._last_delay = 0.0
        self._step = 0  # this worker's step (before_step); 0: the client counts pushes

    @property
    def lr_share(self) -> float:
        """The factor on the lr of each update the servers apply (async, ssp: 1/workers)."""
        return push_lr_share(self.ps.ps_mode, self.n_workers, self.ps.push_lr_share)

    # --- data sharding ------------------------------------------------------------------
    @property
    def data_rank(self) -> int:
        return self.world.rank

    @property
    def data_world_size(self) -> int:
        return self.n_workers

    # --- setup ------------------------------------------------------------------------
    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        super().setup(model, optimizer)
        self.params = list(model.parameters())
        total = sum(p.numel() for p in self.params)
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1:
            raise UsageError(
                f"--strategy ps needs parameters of one dtype, got {sorted(map(str, dtypes))}"
            )
        if total < self.n_servers:
            raise UsageError(f"--servers {self.n_servers} exceeds the {total} parameters")
        self.bounds = shard_bounds(total, self.n_servers)
        # every rank joins the workers' group (new_group is collective on the whole world)
        self.workers_group = new_group(list(range(self.n_workers)), timeout=group_timeout())
        store = dist.distributed_c10d._get_default_store()
        generation = next(_GENERATIONS)
        if self.roles.is_worker:
            keys = [_KEY.format(generation, k) for k in range(self.n_servers)]
            store.wait(keys)
            endpoints = [store.get(key).decode() for key in keys]
            self.client = PSClient(
                self.world.rank,
                endpoints,
                [self.n_workers + k for k in range(self.n_servers)],
                self.bounds,
                dtypes.pop(),
                self.config.train.timeout,
                self.ps.ps_heartbeat,
                self.ps.curve_key(),
            )
            return
        k = self.world.rank - self.n_workers
        lo, hi = self.bounds[k]
        sock, endpoint = bind_router(self.ps.ps_address, self.ps.curve_key())
        host = _publish_host(self.ps.ps_address)
        port = endpoint.rsplit(":", 1)[1]
        store.set(
            _KEY.format(generation, k), f"tcp://{host}:{port}" if ":" not in host else endpoint
        )
        defaults = dict(optimizer.defaults)
        cons = Consistency(
            self.ps.ps_mode, tuple(range(self.n_workers)), self.ps.staleness_bound, self.ps.softsync
        )
        self.server = ShardServer(
            # a server's shard lives in host memory (it is served over zmq), whatever --device
            k,
            flatten(self.params, self.params)[lo:hi].cpu(),
            lambda ps: type(optimizer)(ps, **defaults),
            cons,
            sock,
            staleness_lr=self.ps.staleness_lr,
            lr_share=self.lr_share,
            worker_timeout=self.ps.ps_worker_timeout,
            rank=self.world.rank,
        )
        self._server_checkpoints()

    # --- checkpoints: servers save and restore their own shards (sync mode) ------------
    def _server_checkpoints(self) -> None:
        """Restore this server from ``--resume`` (or a restart); save every N sync rounds.

        A server saves step T's shard and optimizer before it answers round T, so
        every server's file exists before the workers save theirs and rank 0
        commits step T (after a barrier of the workers).
        """
        assert self.server is not None
        tc = self.config.train
        source = checkpoint.resume_source(tc.resume, tc.out)
        part = f"server-{self.server.shard:05d}"
        if source:
            state = checkpoint.load(source, part, checkpoint.saved_world(source))
            try:
                self.server.load_state_dict(state["server"])
            except (KeyError, ValueError) as exc:
                raise UsageError(f"--resume {source}: rank {self.world.rank}: {exc}") from None
        if not (tc.checkpoint_every and tc.out):
            return
        server, every = self.server, tc.checkpoint_every

        def save(step: int) -> None:
            if step % every == 0:
                checkpoint.save(tc.out, step, part, self.n_workers, {"server": server.state_dict()})

        server.on_round = save

    # --- the step ---------------------------------------------------------------------
    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        loss = super().forward_backward(x, y)
        if self.straggler and self.straggler[0] == self.world.rank:
            # A real delay of (FACTOR-1) x this worker's measured step time: the whole previous
            # step (compute, push and pull, loop) without its own delay; this step's compute
            # for the first. The worker is then FACTOR times slower at everything.
            now = time.perf_counter()
            measured = now - start
            if self._last_start is not None:
                measured = start - self._last_start - self._last_delay
            self._last_delay = (self.straggler[1] - 1.0) * measured
            self._last_start = start
            with timeline.span("straggler delay"):
                time.sleep(self._last_delay)
        return loss

    def before_step(self, step: int) -> None:
        self._step = step  # travels with the push: the servers label checkpoints by it

    def after_backward(self) -> None:
        assert self.client is not None
        grads = flatten([p.grad for p in self.params], self.params)
        lr = float(self.optimizer.param_groups[0]["lr"])
        with timeline.span("push/pull"):
            weights = self.client.push(grads, lr, self._step)
        with torch.no_grad():
            unflatten_into(weights, self.params)
        for p in self.params:
            p.grad = None  # the trainer's optimizer.step() then leaves the servers' weights

    def skipped_step(self, step: int) -> None:
        # no push for a skipped fp16 step: say so, so that a sync server still checkpoints
        # step ``step`` (its shard is that step's) under the workers' label
        assert self.client is not None
        with timeline.span("push/pull"), torch.no_grad():
            unflatten_into(self.client.skip(step), self.params)

    def finish(self) -> None:
        assert self.client is not None
        wait = self.config.train.timeout + self.ps.ps_worker_timeout
        weights, self.stats = self.client.done(wait)
        with torch.no_grad():
            unflatten_into(weights, self.params)
        self.client.close()
        lost = {entry["worker"] for s in self.stats for entry in s["lost_workers"]}
        if lost:
            survivors = [w for w in range(self.n_workers) if w not in lost]
            self.workers_group = new_group(
                survivors, use_local_synchronization=True, timeout=group_timeout()
            )
        self._settle_buffers()

    def _settle_buffers(self) -> None:
        """Every worker's BatchNorm statistics made equal, for the evaluated model.

        Averaged over the workers, not rank 0's: the servers' weights are no worker's own,
        and each worker's statistics are its estimate from its own shards under weights
        pulled from them (in async modes each a little stale), so the mean over N
        workers is the better estimate (local SGD's rule); rank 0's alone is what DDP
        keeps, where the replicas share every step. The counts (num_batches_tracked)
        differ where workers ran different numbers of steps: rank 0's. Over the
        survivors (a lost worker's statistics are gone); nothing without buffers."""
        group = self.workers_group
        if dist.get_rank(group) < 0:  # declared lost by the servers, yet still here
            return
        average_buffers(self.model, "native", group)
        broadcast_tensors(integer_buffers(self.model), 0, group)

    # --- reporting --------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        if not self.stats:
            return {}
        staleness: Counter[int] = Counter()
        gaps: Counter[int] = Counter()
        rejected: Counter[str] = Counter()
        lost: dict[int, dict[str, Any]] = {}
        for s in self.stats:
            staleness.update({int(k): v for k, v in s["staleness_histogram"].items()})
            gaps.update({int(k): v for k, v in s["clock_gap_histogram"].items()})
            rejected.update(s["rejected"])
            for entry in s["lost_workers"]:
                lost.setdefault(entry["worker"], {**entry, "rank": entry["worker"]})
        applied = sum(staleness.values())
        first = self.stats[0]
        # One meaning of ``steps`` in every mode: the work done, in synchronous steps, i.e.
        # gradients the servers counted into the budget / workers (sync: the rounds; async:
        # --max-steps once the budget is spent). Rank 0's own loop count is not it: in async
        # modes each worker runs its share (``worker_steps``), and a push made after the
        # budget was spent is discarded.
        steps = first["received"] // self.n_workers
        samples = first["received"] * self.config.train.batch_size // self.n_workers
        seconds = max(s["train_seconds"] for s in self.stats)
        return {
            "steps": steps,
            "ps_mode": self.ps.ps_mode,
            "servers": self.n_servers,
            "push_lr_share": self.lr_share,
            "staleness_lr": self.ps.staleness_lr,
            "straggler": self.ps.straggler,
            "staleness_mean": sum(k * v for k, v in staleness.items()) / max(applied, 1),
            "staleness_max": max(staleness, default=0),
            "staleness_histogram": {str(k): v for k, v in sorted(staleness.items())},
            "clock_gap_max": max(gaps, default=0),
            "clock_gap_histogram": {str(k): v for k, v in sorted(gaps.items())},
            "gradients_received": first["received"],
            "updates_applied": first["version"],
            "worker_steps": first["worker_steps"],
            "samples_trained": samples,
            # the servers' clock, first gradient to last: the same measure in every mode
            "samples_per_second": samples / seconds if seconds > 0 else float("nan"),
            "rejected": dict(rejected),
            "lost_workers": [lost[w] for w in sorted(lost)],
            "per_server": [{key: s[key] for key in _SERVER_KEYS} for s in self.stats],
        }
