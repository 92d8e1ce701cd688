"""The compressor interface: compress to a wire payload, decompress, and state the wire size.

A :class:`Payload` is what one worker puts on the wire for one flat fp32
tensor: ``data`` is the exact tensor sent (fp16/bf16 for casts, raw bytes for
sparse codes); ``numel`` is the dense length, which every receiver already
knows (same model), so it is never sent. Every compressor states its wire size
by its own formula in :meth:`Compressor.wire_bytes`; the strategies send
``data`` through the metered point-to-point layer, and the tests check that
the meter saw exactly the stated bytes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import torch

from disttrain.registry import Registry

__all__ = [
    "SPARSE_DEFAULTS",
    "CollectiveCompressor",
    "Compressor",
    "Configurable",
    "LayerAware",
    "Payload",
    "SparseCompressor",
    "Stateful",
    "add_decoded",
]


@dataclass
class Payload:
    """One compressed tensor: the wire ``data`` and the dense length it stands for."""

    data: torch.Tensor
    numel: int

    @property
    def nbytes(self) -> int:
        """Bytes of ``data`` as it goes on the wire."""
        return self.data.numel() * self.data.element_size()


class Compressor(ABC):
    """Turns a flat fp32 tensor into a :class:`Payload` and back."""

    #: Registry name (``fp16``, ``topk``, ...).
    name: ClassVar[str]
    #: Payloads of the same length can be summed elementwise by an allreduce.
    summable: ClassVar[bool] = False
    #: dtype of ``Payload.data`` on the wire.
    wire_dtype: ClassVar[torch.dtype] = torch.uint8

    @property
    def spec(self) -> str:
        """The spec that builds this compressor again (``topk:0.01``)."""
        return self.name

    @abstractmethod
    def compress(self, tensor: torch.Tensor) -> Payload:
        """Encode the flat float ``tensor``."""

    @abstractmethod
    def decompress(self, payload: Payload) -> torch.Tensor:
        """The dense fp32 tensor of ``payload.numel`` entries that ``payload`` stands for."""

    def compress_and_decode(self, tensor: torch.Tensor) -> tuple[Payload, torch.Tensor]:
        """The payload and the dense tensor it decodes to (override when cheaper than both)."""
        payload = self.compress(tensor)
        return payload, self.decompress(payload)

    @abstractmethod
    def wire_bytes(self, payload: Payload) -> int:
        """Bytes this payload costs on the wire, by the compressor's own size formula."""

    def fixed_wire_numel(self, numel: int) -> int | None:
        """Wire elements for a dense length, when it does not depend on the values."""
        del numel
        return None

    def __repr__(self) -> str:
        return f"<compressor {self.spec}>"


# --- capabilities: what some compressors do besides the interface (PowerSGD today). A
# caller asks ``isinstance(c, Stateful)``; a compressor has one by defining its methods.


@runtime_checkable
class LayerAware(Protocol):
    """Works per layer: told how the flat input is cut (a strategy's gradients, a DDP
    bucket: these tensors flattened in order)."""

    def bind_shapes(self, shapes: Sequence[torch.Size]) -> None: ...


@runtime_checkable
class Configurable(Protocol):
    """Reads its own settings section (``CompressorKind.section``) from the run's config;
    the spec alone builds the rest."""

    def configure(self, config: Any) -> None: ...


@runtime_checkable
class Stateful(Protocol):
    """Carries state from step to step (PowerSGD's warm-start Q), for checkpoints, and
    reports figures of its own in the run's summary."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def figures(self) -> dict[str, Any]: ...


def add_decoded(compressor: Compressor, total: torch.Tensor, payload: Payload) -> None:
    """``total += decompress(payload)`` in place; a sparse code adds only its entries."""
    if isinstance(compressor, SparseCompressor):
        compressor.add_into(total, payload)
    else:
        total += compressor.decompress(payload)


class SparseCompressor(Compressor):
    """A compressor whose payload is a list of entries: sorted indices and their values.

    Decoding touches only those entries: :meth:`add_into` scatters them into
    the running sum instead of building and adding a dense tensor per peer
    (decentralized one-bit at tau 0.03: 1.6-1.7x the samples/s, benchmarks/
    RESULTS.md, "Talking less").
    """

    @abstractmethod
    def entries(self, payload: Payload) -> tuple[np.ndarray, np.ndarray]:
        """The sent indices (sorted, int64) and their float32 values."""

    @property
    @abstractmethod
    def nominal_share(self) -> float:
        """The share of entries it is meant to send (compression/starved.py warns far below)."""

    def decompress(self, payload: Payload) -> torch.Tensor:
        out = torch.zeros(payload.numel, dtype=torch.float32)
        self.add_into(out, payload)
        return out

    def add_into(self, total: torch.Tensor, payload: Payload) -> None:
        # Indices are unique, so the scatter is a plain per-entry add: the same
        # float operations, in the same order, as adding the dense decode.
        idx, values = self.entries(payload)
        total.index_add_(0, torch.from_numpy(idx), torch.from_numpy(values))


class CollectiveCompressor(Compressor):
    """A compressor whose exchange is its own sequence of allreduces of summable tensors.

    PowerSGD sums P, orthogonalizes it, then sums Q: the encoding of the second
    round needs the sum of the first, so it cannot be one payload put on the
    wire. :meth:`reduce` runs the rounds through the ``sum_`` it is given (any
    allreduce algorithm); :meth:`compress` / :meth:`decompress` are the same
    code on a world of one (one rank's payload and what it decodes to).
    """

    summable = True
    wire_dtype: ClassVar[torch.dtype] = torch.float32

    @abstractmethod
    def reduce(
        self,
        acc: torch.Tensor,
        sum_: Callable[[torch.Tensor], object],
        size: int,
        out: torch.Tensor,
    ) -> torch.Tensor:
        """Write into the flat ``out`` the mean over the ``size`` ranks of what every rank's
        flat ``acc`` encodes to; return this rank's part of it (what counts as sent, for
        error feedback; valid until ``out`` is next written). ``sum_(t)`` must leave the sum
        of every rank's ``t`` in ``t``, in place. ``out`` may be ``acc`` itself (no error
        feedback). The mean, not the sum: DDP's hook wants the mean, and writing it at once
        saves two passes over the model (× n, then ÷ n) on every step."""

    @abstractmethod
    def round_numels(self, numel: int) -> list[int]:
        """Entries of each tensor :meth:`reduce` sums for a flat input of ``numel``."""

    def wire_bytes(self, payload: Payload) -> int:
        return payload.data.numel() * payload.data.element_size()

    def fixed_wire_numel(self, numel: int) -> int | None:
        return sum(self.round_numels(numel))

    def codec_flops(self, numel: int) -> float:
        """Floating-point operations one step's encoding and decoding take for a flat input
        of ``numel`` (the cost model's codec term: PowerSGD's low-rank matmuls)."""
        del numel
        return 0.0


#: Defaults of the sparse compressors (topk, onebit): plain SGD at the momentum default's
#: effective step, lr / (1 - momentum) = 0.05 / 0.1. A sparse code holds most coordinates
#: back for many steps (error feedback sends them later), and momentum SGD re-applies
#: each delayed update for 1 / (1 - momentum) steps (the reason DGC corrects momentum).
#: Measured on the default workload (mlp, digits, 5 epochs, 2 workers; allreduce 0.958):
#: allreduce topk:0.01 0.911 with momentum, 0.956 with these; decentralized onebit:0.01
#: 0.806 with momentum, 0.914 with --momentum-correction, 0.964 with these.
SPARSE_DEFAULTS: dict[str, Any] = {"optimizer": "sgd", "lr": 0.5}


@dataclass(frozen=True)
class CompressorKind:
    """One compressor name: its builder, parameter, spec default and payload size facts."""

    build: Callable[..., Compressor]  # called with the parameter, or with none
    param: str = ""  # "RATIO": the spec's parameter (``topk:RATIO``); "" takes none
    param_help: str = ""  # how to write the parameter, for the error message
    default: str = ""  # a bare name's parameter in a compare/advise spec ("" none)
    # Cost model: bits per sent value, and the share of entries sent: "all" (dense, no
    # index), "param" (the parameter is the share) or "data" (depends on the gradients).
    value_bits: int = 32
    density: str = "all"
    # Its own settings section (a ``@register_section`` dataclass), read through
    # ``Compressor.configure``; strategies that send compressed gradients declare it.
    section: type[Any] | None = None
    # Its own defaults for the run's other settings, used unless given
    # (``config.choice_defaults``): what makes the default workload train with it.
    setting_defaults: dict[str, Any] = field(default_factory=dict)

    def defaults_for(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Its defaults given the run's settings (as a strategy's): fixed for a compressor."""
        del settings
        return dict(self.setting_defaults)


#: Every compressor by name (``--compression NAME[:PARAM]``); each compressor's file
#: registers its own kind (:mod:`disttrain.compression.registry` finds the files).
COMPRESSORS: Registry[CompressorKind] = Registry("compressor", flag="--compression")
