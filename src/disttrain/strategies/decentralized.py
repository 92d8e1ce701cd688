"""Decentralized compressed SGD: no server, no global allreduce; peers exchange compressed updates.

``--topology all`` (Strom 2015): each worker adds its gradient to its residual,
compresses (``--compression``, e.g. ``onebit:TAU``), sends the payload to every
peer and sums what it receives after decoding, in rank order so that every
replica applies bit-identical updates and the replicas never drift apart.

``--topology ring``: each worker talks only to its two ring neighbours, so
replicas differ and must be mixed by gossip. Sending compressed *gradients*
to neighbours would let the replicas drift without bound, so the ring runs
CHOCO-SGD (Koloskova, Stich & Jaggi, ICML 2019): every worker keeps public
copies x̂ of itself and its neighbours, sends C(x - x̂_self) (its change since
last sent: the error feedback is x - x̂), updates the copies with what is
decoded, and moves toward its neighbours by ``x += γ Σ_j w_ij (x̂_j - x̂_i)``
with Metropolis weights (1/3 on a ring). There ``onebit:TAU`` thresholds
*parameter* changes, so TAU is in parameter units (about lr × gradient).

Two options of the all-peers exchange, both measured in benchmarks/RESULTS.md:
``--active-warmup-steps S --active-workers K`` lets only ranks [0, K) send for
the first S steps (the seed's "fewer nodes early in training"); the others
send an empty update, keep no residual for those steps, and the sum is
divided by K. ``--momentum-correction`` (with ``--optimizer momentum``) is
Deep Gradient Compression's fix for momentum under sparsification (Lin et al.,
ICLR 2018): the velocity ``u = m·u + g`` is kept locally and accumulated into
the residual *before* compression, the optimizer's own momentum is set to 0,
and ``u`` is zeroed wherever an entry was sent (momentum factor masking), so a
delayed ±τ entry is applied once instead of being re-applied by momentum.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from disttrain import collectives, timeline
from disttrain.comm import phases
from disttrain.comm.errors import UsageError
from disttrain.comm.meter import meter
from disttrain.compression import (
    LENGTH_BYTES,
    CompressionConfig,
    CompressionStats,
    ErrorFeedback,
    Payload,
    SparseCompressor,
    all_peers,
    empirical_entropy_bits,
    exchange_payloads,
    parse,
)
from disttrain.compression.base import CollectiveCompressor, add_decoded
from disttrain.compression.exchange import compression_figures, dense_allreduce_bytes
from disttrain.compression.starved import StarvedCheck
from disttrain.config import RunConfig, opt, register_section
from disttrain.dataparallel.average import average
from disttrain.dataparallel.buffers import average_buffers
from disttrain.strategies.base import Strategy, register
from disttrain.strategies.capabilities import Reshards
from disttrain.strategies.settings import StrategySettings
from disttrain.strategies.state import average_states

__all__ = ["Decentralized", "DecentralizedConfig", "DecentralizedSettings", "ring_neighbours"]


def _host_flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors flattened into one, on the host: the codecs encode there (numpy), so a
    GPU's gradients and weights are staged to host memory and copied back (docs/gpu.md)."""
    return _flatten_dense_tensors(tensors).cpu()


@register_section
@dataclass(frozen=True)
class DecentralizedConfig:
    """Settings of ``--strategy decentralized``."""

    topology: str = opt("all", "decentralized: who talks to whom", ("all", "ring"))
    consensus_step: float = opt(0.5, "decentralized ring: gossip step γ of CHOCO-SGD, in (0, 1]")
    active_warmup_steps: int = opt(
        0, "decentralized: for the first N steps only --active-workers ranks send updates"
    )
    active_workers: int = opt(1, "decentralized: ranks that send during --active-warmup-steps")
    momentum_correction: bool = opt(
        False, "decentralized: DGC momentum correction and masking (needs --optimizer momentum)"
    )

    def validate(self) -> None:
        if not 0 < self.consensus_step <= 1:
            raise UsageError(f"--consensus-step must be in (0, 1], got {self.consensus_step}")
        if self.active_warmup_steps < 0:
            raise UsageError(f"--active-warmup-steps must be >= 0, got {self.active_warmup_steps}")
        if self.active_workers < 1:
            raise UsageError(f"--active-workers must be >= 1, got {self.active_workers}")

    def validate_with(self, train: Any) -> None:
        """Checks that need the training settings (before any worker starts)."""
        if self.momentum_correction and train.optimizer != "momentum":
            raise UsageError(
                f"--momentum-correction replaces the optimizer's momentum: use --optimizer "
                f"momentum (got {train.optimizer})"
            )
        if self.topology == "ring" and (self.momentum_correction or self.active_warmup_steps):
            raise UsageError("--momentum-correction and --active-warmup-steps need --topology all")
        if self.active_warmup_steps and self.active_workers > train.world_size:
            raise UsageError(
                f"--active-workers {self.active_workers} exceeds the {train.world_size} workers"
            )


def ring_neighbours(rank: int, size: int) -> tuple[list[int], list[int]]:
    """Rounds of (send to, receive from) for the ring: right then left (one peer if size 2)."""
    if size == 2:
        return [1 - rank], [1 - rank]
    right, left = (rank + 1) % size, (rank - 1) % size
    return [right, left], [left, right]


class DecentralizedSettings(StrategySettings):
    """What decentralized SGD reads: its topology and warm-up, the compressor, --algorithm."""

    main_setting: ClassVar[str | None] = "compression"
    modes: ClassVar[dict[str, tuple[str, ...]]] = {
        "": (),
        "onebit": ("--compression", "onebit:0.01"),
    }
    # --algorithm: the start-up average that makes the replicas equal
    reads_settings = (DecentralizedConfig, CompressionConfig, "algorithm")

    @classmethod
    def settings_not_read(cls, config: RunConfig) -> dict[str, str]:
        settings: DecentralizedConfig = config.section(DecentralizedConfig)
        unread: dict[str, str] = {}
        if settings.topology == "ring" and config.train.world_size > 2:
            # CHOCO keeps x - x̂ as its residual; the compressor's own feedback is not used
            unread["error_feedback"] = "with --topology ring (CHOCO's x - x̂ is the residual)"
        elif settings.topology == "all":
            unread["consensus_step"] = "with --topology all (no gossip step)"
        else:  # a ring of two is the all-peers exchange
            unread["consensus_step"] = "with --topology ring on 2 workers (no gossip step)"
        if not settings.active_warmup_steps:
            unread["active_workers"] = "without --active-warmup-steps"
        return unread

    @classmethod
    def validate_config(cls, config: RunConfig, model: nn.Module) -> None:
        super().validate_config(config, model)
        config.section(DecentralizedConfig).validate_with(config.train)
        spec = config.section(CompressionConfig).compression
        if isinstance(parse(spec), CollectiveCompressor):  # PowerSGD: rounds of allreduces
            raise UsageError(
                f"--compression {spec}: its exchange is a sequence of allreduces over all "
                "workers; decentralized sends one payload to each neighbour (use it with "
                "--strategy allreduce)"
            )


# Reshards: replicas averaged on a resume on another worker count (``reshard``)
@register(
    settings=DecentralizedSettings, cost="disttrain.strategies.cost.decentralized:DecentralizedCost"
)
class Decentralized(Strategy, Reshards):
    """Compressed updates to all peers (Strom) or ring neighbours (CHOCO gossip)."""

    name = "decentralized"

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        super().setup(model, optimizer)
        cc = self.config.section(CompressionConfig)
        self.settings: DecentralizedConfig = self.config.section(DecentralizedConfig)
        self.compressor = parse(cc.compression)
        self.rank, self.size = self.world.rank, self.world.world_size
        self.ring = self.settings.topology == "ring" and self.size > 2
        # the ring never uses it (CHOCO's x - x̂ is its residual): --error-feedback is not read
        self.feedback = ErrorFeedback(self.compressor, enabled=not self.ring and cc.error_feedback)
        self.stats = CompressionStats(starved=StarvedCheck(self.compressor))
        self.entries_sent = 0
        self.claimed_bytes = 0
        self.payload_bytes = 0
        self.entropy_bits_sum = 0.0
        self.sparse_payloads = 0
        self.steps_exchanged = 0
        self.velocity: torch.Tensor | None = None
        self.momentum = 0.0
        if self.settings.momentum_correction:
            self.settings.validate_with(self.config.train)
            group = optimizer.param_groups[0]
            self.momentum = float(group.get("momentum", 0.0))
            for group in optimizer.param_groups:
                group["momentum"] = 0.0  # applied here, before compression, instead
        params = list(model.parameters())
        # Replicas start equal (outside the measured traffic: the trainer resets the meter).
        self.algorithm = collectives.build(self.config.train.algorithm, self.config)
        average(list(model.state_dict().values()), self.algorithm, world_size=self.size)
        if self.ring:
            x = _host_flat([p.detach() for p in params])
            send_to, _ = ring_neighbours(self.rank, self.size)
            # every replica starts at the same x0, so x0 is common knowledge: x̂ = x0
            self.public = {r: x.clone() for r in [self.rank, *send_to]}

    # --- accounting ------------------------------------------------------------------
    def _account(self, payload: Payload, peers: int, before: int) -> None:
        reference = dense_allreduce_bytes(payload.numel, self.size, self.rank, self.algorithm)
        self.stats.add(4 * payload.numel * peers, reference, meter.bytes_sent - before)
        self.payload_bytes += payload.nbytes
        prefix = 0 if self.compressor.fixed_wire_numel(payload.numel) else LENGTH_BYTES
        self.claimed_bytes += peers * (self.compressor.wire_bytes(payload) + prefix)
        if isinstance(self.compressor, SparseCompressor):
            self.stats.starved.count(payload)
            idx = self.compressor.entries(payload)[0]  # O(entries), not a scan of ``sent``
            self.entries_sent += int(idx.size)
            self.entropy_bits_sum += empirical_entropy_bits(idx) * idx.size
            self.sparse_payloads += 1

    # --- all peers: Strom -----------------------------------------------------------
    def after_backward(self) -> None:
        if self.ring:
            return
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if not grads:
            return
        before = meter.bytes_sent
        self.steps_exchanged += 1
        flat = _host_flat(grads)
        warm = self.steps_exchanged <= self.settings.active_warmup_steps
        active = min(self.settings.active_workers, self.size) if warm else self.size
        with phases.book(phases.CODEC):  # encoding: booked apart from the exchange
            payload, mine = self._encode(flat, active)
        send_to, recv_from = all_peers(self.rank, self.size)
        with timeline.span("exchange", peers=len(send_to)):
            got = exchange_payloads(payload, self.compressor, send_to, recv_from)
        payloads = dict(zip(recv_from, got, strict=True))
        with phases.book(phases.CODEC):  # decoding every payload into the sum
            total = torch.zeros_like(mine)
            for r in range(self.size):  # the same order on every rank: identical replicas
                if r == self.rank:
                    total += mine
                else:  # sparse codes add only their entries (same float ops as a dense add)
                    add_decoded(self.compressor, total, payloads[r])
            total /= active
            self._account(payload, len(send_to), before)
        for g, v in zip(grads, _unflatten_dense_tensors(total, grads), strict=True):
            g.copy_(v)

    def _encode(self, flat: torch.Tensor, active: int) -> tuple[Payload, torch.Tensor]:
        """This rank's payload for the all-peers exchange, and what it decodes to."""
        if self.rank >= active:
            # inactive early on: an empty update (no residual, no velocity kept for it)
            return self.compressor.compress_and_decode(torch.zeros_like(flat))
        if self.settings.momentum_correction:
            # DGC: u = m·u + g accumulated into the residual; u masked where sent
            if self.velocity is None:
                self.velocity = torch.zeros_like(flat)
            self.velocity.mul_(self.momentum).add_(flat)
            payload, mine = self.feedback.compress(self.velocity)
            self.velocity.masked_fill_(mine != 0, 0.0)
            return payload, mine
        return self.feedback.compress(flat)

    # --- ring: CHOCO gossip ---------------------------------------------------------
    def after_step(self, step: int) -> None:
        if not self.ring:
            return
        params = list(self.model.parameters())
        x = _host_flat([p.detach() for p in params])
        before = meter.bytes_sent
        own = self.public[self.rank]
        with phases.book(phases.CODEC):
            payload, sent = self.compressor.compress_and_decode(x - own)
        own += sent
        send_to, recv_from = ring_neighbours(self.rank, self.size)
        with timeline.span("gossip", peers=len(send_to)):
            got = exchange_payloads(payload, self.compressor, send_to, recv_from)
        with phases.book(phases.CODEC):  # decoding (and counting the entries of our payload)
            for src, theirs in zip(recv_from, got, strict=True):
                add_decoded(self.compressor, self.public[src], theirs)
            self._account(payload, len(send_to), before)
        for src in recv_from:  # Metropolis-Hastings weight on a ring: 1 / (1 + max degree) = 1/3
            x += self.settings.consensus_step * (1.0 / 3.0) * (self.public[src] - own)
        with torch.no_grad():
            for p, v in zip(params, _unflatten_dense_tensors(x, params), strict=True):
                p.copy_(v)
        self._residual = x - own

    def finish(self) -> None:
        # Ring replicas differ: evaluate their average (one dense allreduce, outside the meter).
        if self.ring:
            with meter.paused():
                average(list(self.model.parameters()), "native", world_size=self.size)
        # BatchNorm's statistics, averaged (not rank 0's): each replica's estimate from its
        # own shards, under weights that are equal (all peers) or just averaged (ring), as
        # local SGD averages them; once, at the end, outside the meter as the ring's average
        # (a broadcast before every step, as DDP, would add the global collective this
        # strategy exists to avoid)
        with meter.paused():
            average_buffers(self.model, "native", world_size=self.size)

    # --- reporting ------------------------------------------------------------------
    def residual_norm(self) -> float:
        if self.ring:
            res = getattr(self, "_residual", None)
            return 0.0 if res is None else float(res.norm())
        return self.feedback.residual_norm()

    def step_metrics(self) -> dict[str, Any]:
        return {**compression_figures(self.stats), "residual_norm": self.residual_norm()}

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "compression": self.compressor.spec,
            "topology": "ring" if self.ring else "all",
            **compression_figures(self.stats),
            "dense_fp32_bytes_per_rank": self.stats.dense_bytes,
            "dense_allreduce_bytes_per_rank": self.stats.allreduce_bytes,
            "compressed_bytes_per_rank": self.stats.sent_bytes,
            "claimed_wire_bytes_per_rank": self.claimed_bytes,
            "residual_norm": self.residual_norm(),
            "length_prefix_bytes": 0 if self.compressor.summable else LENGTH_BYTES,
            "active_warmup_steps": self.settings.active_warmup_steps,
            "active_workers": self.settings.active_workers,
            "momentum_correction": self.momentum if self.settings.momentum_correction else None,
        }
        if self.sparse_payloads:
            n = max(self.entries_sent, 1)
            out["entries_sent_per_step"] = self.entries_sent / self.sparse_payloads
            out["bits_per_sent_entry"] = 8 * self.payload_bytes / n
            # gap entropy + 1 sign bit (onebit) or + 32 value bits (topk): the ideal coder's cost
            extra = 1.0 if self.compressor.name == "onebit" else 32.0
            out["entropy_bits_per_sent_entry"] = self.entropy_bits_sum / n + extra
        return out

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "feedback": self.feedback.state_dict(),
            "steps_exchanged": torch.tensor(self.steps_exchanged),
        }
        if self.velocity is not None:
            state["velocity"] = self.velocity.clone()
        if self.ring:
            state["public"] = {r: v.clone() for r, v in self.public.items()}
        return state

    @classmethod
    def reshard(
        cls, read: Callable[[int], dict[str, Any]], old_world: int, rank: int, world: int
    ) -> dict[str, Any]:
        """Every new worker starts from the average of the N replicas (a full consensus
        step); CHOCO's public copies of the old neighbours are dropped: all become that
        average (load_state_dict), which every new neighbour then holds."""
        del rank, world
        states = [read(j) for j in range(old_world)]
        for s in states:
            s["strategy"].pop("public", None)
        return average_states(states)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.ring and "public" not in state:  # resharded: every replica is the average
            x = _flatten_dense_tensors([p.detach() for p in self.model.parameters()])
            self.public = {r: x.clone() for r in self.public}
        self.feedback.load_state_dict(state.get("feedback", {}))
        self.steps_exchanged = int(state.get("steps_exchanged", 0))
        if state.get("velocity") is not None:
            self.velocity = state["velocity"].clone()
        if self.ring and "public" in state:
            self.public = {int(r): v.clone() for r, v in state["public"].items()}
