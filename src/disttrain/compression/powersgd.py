"""PowerSGD (Vogels, Karimireddy & Jaggi, 2019): each gradient matrix sent as rank-r factors.

Per layer, the gradient (plus its error-feedback residual) is viewed as an
n x m matrix M (``shape[0]`` rows, the rest flattened) and approximated by one
step of subspace (power) iteration, warm-started from the last step's Q:

    Q <- orthogonalize(Q_prev)          (the first time: standard normal, seeded)
    P  = M Q          -> allreduce (sum) -> orthogonalize
    Q  = M^T P        -> allreduce (sum) / n
    M_hat = P Q^T     (the mean over workers of the rank-r approximations)

P and Q are plain sums, so they ride any allreduce algorithm: (n + m)·r
entries instead of n·m. As in torch's ``powerSGD_hook`` (whose arithmetic and
seeding this follows step for step, so the two agree to float rounding): a
matrix is compressed only when (n + m)·r·``min_compression_rate`` < n·m;
vectors and small matrices are summed uncompressed in one tensor; the
residual is ``acc - M_hat`` (the mean; summed over workers that is the same
total as the paper's ``acc - P Q_w^T``, so error feedback still loses nothing);
``--powersgd-start-step S`` runs the first S steps as a plain dense allreduce.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from disttrain.comm import phases
from disttrain.comm.errors import UsageError
from disttrain.compression.base import COMPRESSORS, CollectiveCompressor, CompressorKind, Payload
from disttrain.config import opt, register_section

__all__ = ["PowerSGD", "PowerSGDConfig", "orthogonalize"]


@register_section
@dataclass(frozen=True)
class PowerSGDConfig:
    """Settings of ``--compression powersgd:RANK``."""

    powersgd_start_step: int = opt(
        0, "powersgd: plain dense allreduce for the first S steps (torch's start_powerSGD_iter)"
    )

    def validate(self) -> None:
        if self.powersgd_start_step < 0:
            raise UsageError(f"--powersgd-start-step must be >= 0, got {self.powersgd_start_step}")


def orthogonalize(matrix: torch.Tensor) -> None:
    """Orthonormalize the columns of the n x r ``matrix`` in place, as torch's hook does.

    Gram-Schmidt for r <= 2, Householder QR above. A zero column stays zero
    (torch divides by its zero norm and gets NaN; a layer with no gradient
    would poison the step).
    """
    rank = matrix.shape[1]
    if rank > 2:
        matrix.copy_(torch.linalg.qr(matrix).Q)
        return
    for i in range(rank):
        col = matrix[:, i : i + 1]
        col /= torch.norm(col, dim=0, keepdim=True).clamp_min(1e-30)
        if i + 1 < rank:
            rest = matrix[:, i + 1 :]
            rest -= torch.sum(col * rest, dim=0, keepdim=True) * col


@dataclass(frozen=True)
class _Plan:
    """Where each tensor of the flat input sits and how it is sent."""

    numel: int
    matrices: list[tuple[int, int, int, int]]  # (offset, n, m, r), grouped by shape like torch
    vectors: list[tuple[int, int]]  # (offset, numel): summed uncompressed
    p_numel: int
    q_numel: int
    uncompressed: int


class PowerSGD(CollectiveCompressor):
    """Rank-``rank`` PowerSGD with warm start; error feedback is the caller's."""

    name = "powersgd"

    def __init__(
        self,
        rank: float,
        min_compression_rate: float = 2.0,
        start_step: int = 0,
        seed: int = 0,
        warm_start: bool = True,
    ) -> None:
        if rank != int(rank) or rank < 1:
            raise ValueError(f"rank must be a whole number >= 1, got {rank:g}")
        self.rank = int(rank)
        self.min_compression_rate = min_compression_rate
        self.start_step = start_step
        self.warm_start = warm_start
        # torch's PowerSGDState: np.random.RandomState(random_seed), one draw per Q init
        self.seed, self.draws = seed, 0
        self.rng = np.random.RandomState(seed)
        self.shapes: list[torch.Size] | None = None
        self.q: torch.Tensor | None = None  # last step's mean Q (warm start)
        self.calls = 0
        self._plan: _Plan | None = None
        self._sent: tuple[torch.Tensor, ...] = ()  # the last call's wire tensors, as decoded

    @property
    def spec(self) -> str:
        return f"powersgd:{self.rank}"

    def configure(self, config: Any) -> None:
        self.start_step = config.section(PowerSGDConfig).powersgd_start_step

    def bind_shapes(self, shapes: Sequence[torch.Size]) -> None:
        shapes = [torch.Size(s) for s in shapes]
        if shapes != self.shapes:
            # other tensors: last step's Q no longer fits (the first binding keeps a Q loaded
            # from a checkpoint; its size is checked against the plan when it is used)
            if self.shapes is not None:
                self.q = None
            self.shapes, self._plan = shapes, None

    # --- layout -------------------------------------------------------------------------
    def plan(self, numel: int) -> _Plan:
        """Which tensors are compressed (torch's ``_should_compress``) and where P, Q go."""
        if self._plan is not None and self._plan.numel == numel:
            return self._plan
        shapes = self.shapes or [torch.Size([numel])]
        if sum(s.numel() for s in shapes) != numel:
            raise ValueError(
                f"bound shapes hold {sum(s.numel() for s in shapes)} entries, not {numel}"
            )
        by_shape: dict[tuple[int, int], list[int]] = {}  # torch batches by shape, in first order
        vectors: list[tuple[int, int]] = []
        offset = 0
        for s in shapes:
            n = s[0] if len(s) else 1
            m = s.numel() // n if n else 0
            r = min(n, m, self.rank)
            if (n + m) * r * self.min_compression_rate < n * m:
                by_shape.setdefault((n, m), []).append(offset)
            else:
                vectors.append((offset, s.numel()))
            offset += s.numel()
        matrices = [(o, n, m, min(n, m, self.rank)) for (n, m), os in by_shape.items() for o in os]
        self._plan = _Plan(
            numel,
            matrices,
            vectors,
            sum(n * r for _, n, _, r in matrices),
            sum(m * r for _, _, m, r in matrices),
            sum(k for _, k in vectors),
        )
        return self._plan

    def round_numels(self, numel: int) -> list[int]:
        plan = self.plan(numel)
        if self.calls < self.start_step:
            return [numel]
        return [k for k in (plan.uncompressed, plan.p_numel, plan.q_numel) if k]

    def codec_flops(self, numel: int) -> float:
        """Per compressed n x m matrix at rank r: P = M Q, Q = M^T P and M_hat = P Q^T, 2nmr
        flops each, and the orthogonalization of P and Q (Gram-Schmidt: ~4r² per row);
        nothing during the dense warm-up. Error feedback and the division are elementwise."""
        if self.calls < self.start_step:
            return 0.0
        return float(
            sum(6 * n * m * r + 4 * (n + m) * r * r for _, n, m, r in self.plan(numel).matrices)
        )

    # --- the exchange ---------------------------------------------------------------------
    def reduce(
        self,
        acc: torch.Tensor,
        sum_: Callable[[torch.Tensor], object],
        size: int,
        out: torch.Tensor,
    ) -> torch.Tensor:
        flat = acc.detach().reshape(-1)
        if self.calls < self.start_step:  # dense warm-up: everything is sent, nothing left out
            self.calls += 1
            out.copy_(flat)
            sum_(out)
            out.div_(size)
            self._sent = (flat,)
            return flat
        self.calls += 1
        plan = self.plan(flat.numel())
        with phases.book(phases.CODEC):
            vec = torch.cat([flat[o : o + k] for o, k in plan.vectors]) if plan.vectors else None
            mats = [flat[o : o + n * m].view(n, m) for o, n, m, _ in plan.matrices]
            q_flat, qs = self._start_q(plan)
            p_flat = torch.empty(plan.p_numel)
            ps = self._views(p_flat, plan, "p")
            for mat, q, p in zip(mats, qs, ps, strict=True):
                torch.mm(mat, q, out=p)
        if vec is not None:
            sum_(vec)  # torch sends the uncompressed tensors first, then P
        if plan.p_numel:
            sum_(p_flat)
            with phases.book(phases.CODEC):
                for mat, p, q in zip(mats, ps, qs, strict=True):
                    orthogonalize(p)  # the sum of P is orthogonalized; no need to divide by n
                    torch.mm(mat.t(), p, out=q)
            sum_(q_flat)
        with phases.book(phases.CODEC):
            q_flat.div_(size)
            # what a world of one would have sent: the vectors, P and Q as decoded
            self._sent = tuple(t for t in (vec, p_flat, q_flat) if t is not None and t.numel())
            self._write_mean(out, plan, vec, ps, qs, size)
        return out

    def _start_q(self, plan: _Plan) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """This step's Q (``self.q``) and its per-matrix views, each orthogonalized.

        Warm start: last step's mean Q, if it fits the plan. Else a fresh Gaussian Q,
        drawn from a seed that ``self.rng`` gives, so every rank draws the same Q, as
        torch's PowerSGDState does.
        """
        if self.q is not None and self.q.numel() != plan.q_numel:
            self.q = None  # a Q for other tensors (a checkpoint of another model)
        if self.q is None or not self.warm_start:
            self.q = torch.empty(plan.q_numel)
            qs = self._views(self.q, plan, "q")
            with torch.random.fork_rng(devices=[]):  # the same Q on every rank, as torch
                torch.manual_seed(self.rng.randint(1_000_000_000))
                self.draws += 1
                for q in qs:
                    q.copy_(torch.randn(*q.shape))
                    orthogonalize(q)
        else:
            qs = self._views(self.q, plan, "q")
            for q in qs:
                orthogonalize(q)
        return self.q, qs

    @staticmethod
    def _write_mean(
        out: torch.Tensor,
        plan: _Plan,
        vec: torch.Tensor | None,
        ps: list[torch.Tensor],
        qs: list[torch.Tensor],
        size: int,
    ) -> None:
        """The mean into ``out``: each vector's sum / size, each matrix as P Q^T (Q already
        the mean)."""
        # Every entry is a vector's or a matrix's, so ``out`` is written whole: the mean
        # straight into the caller's buffer, as torch's hook writes into its bucket (each
        # matrix of ``acc`` is read for the last time above, so ``out`` may be ``acc``).
        if vec is not None:
            vec.div_(size)
            for (o, k), part in zip(
                plan.vectors, vec.split([k for _, k in plan.vectors]), strict=True
            ):
                out[o : o + k] = part
        for (o, n, m, _), p, q in zip(plan.matrices, ps, qs, strict=True):
            torch.mm(p, q.t(), out=out[o : o + n * m].view(n, m))

    @staticmethod
    def _views(buf: torch.Tensor, plan: _Plan, which: str) -> list[torch.Tensor]:
        out, at = [], 0
        for _, n, m, r in plan.matrices:
            rows = n if which == "p" else m
            out.append(buf[at : at + rows * r].view(rows, r))
            at += rows * r
        return out

    # --- one rank's payload ---------------------------------------------------------------
    def compress(self, tensor: torch.Tensor) -> Payload:
        return self.compress_and_decode(tensor)[0]

    def compress_and_decode(self, tensor: torch.Tensor) -> tuple[Payload, torch.Tensor]:
        """The exchange on a world of one: the payload is (vectors, P, Q) as sent."""
        flat = tensor.detach().reshape(-1).float()
        mine = self.reduce(flat, lambda t: None, 1, torch.empty_like(flat))
        return Payload(torch.cat(self._sent), tensor.numel()), mine

    def decompress(self, payload: Payload) -> torch.Tensor:
        plan = self.plan(payload.numel)
        data = payload.data.float()
        if data.numel() == payload.numel:  # a dense warm-up step (or nothing worth compressing)
            return data.clone()
        out = torch.empty(payload.numel)
        at = 0
        for o, k in plan.vectors:
            out[o : o + k] = data[at : at + k]
            at += k
        ps = self._views(data[at : at + plan.p_numel], plan, "p")
        qs = self._views(data[at + plan.p_numel :], plan, "q")
        for (o, n, m, _), p, q in zip(plan.matrices, ps, qs, strict=True):
            out[o : o + n * m] = (p @ q.t()).reshape(-1)
        return out

    def figures(self) -> dict[str, Any]:
        if self._plan is None:
            return {}
        plan = self._plan
        ratios = [n * m / ((n + m) * r) for _, n, m, r in plan.matrices]
        return {
            "powersgd_rank": self.rank,
            "powersgd_matrices": len(plan.matrices),
            "powersgd_uncompressed_entries": plan.uncompressed,
            "powersgd_largest_layer_ratio": round(max(ratios), 3) if ratios else None,
            "powersgd_wire_entries": plan.uncompressed + plan.p_numel + plan.q_numel,
            "powersgd_dense_entries": plan.numel,
        }

    def state_dict(self) -> dict[str, Any]:
        """Warm-start Q, the step count and the draws of the seed stream (an exact resume)."""
        q = None if self.q is None else self.q.clone()
        return {"q": q, "calls": self.calls, "draws": self.draws}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        q = state.get("q")
        self.q = None if q is None else q.clone()
        self.calls = int(state.get("calls", 0))
        self.draws = int(state.get("draws", 0))
        self.rng = np.random.RandomState(self.seed)
        for _ in range(self.draws):  # the same stream position as before the checkpoint
            self.rng.randint(1_000_000_000)


COMPRESSORS.add(
    "powersgd",
    CompressorKind(PowerSGD, "RANK", "RANK (a whole number >= 1)", "2", section=PowerSGDConfig),
)
