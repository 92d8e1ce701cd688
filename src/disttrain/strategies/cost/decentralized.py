"""Decentralized SGD's cost: compressed payloads to every peer or to two ring neighbours."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from disttrain import costing
from disttrain.compression import CompressionConfig
from disttrain.compression.registry import COMPRESSORS
from disttrain.strategies.cost.base import StrategyCost
from disttrain.strategies.decentralized import DecentralizedConfig

if TYPE_CHECKING:
    from disttrain.strategies.runspec import RunSpec

__all__ = ["DecentralizedCost"]


class DecentralizedCost(StrategyCost):
    """Step time of decentralized SGD (``advise``)."""

    cost_settings: ClassVar[tuple[str, ...]] = ("compression", "topology")
    assumptions: ClassVar[dict[str, str]] = {
        "density": "the share of entries a compressor sends when the data sets it (onebit)"
    }

    def advise_specs(self) -> list[str]:
        # one-bit sends what exceeds τ: the 1 % share is a stated assumption, not derived
        return [
            f"{self.name}:onebit:density=0.01",
            f"{self.name}:onebit:density=0.01:topology=ring",
        ]

    def _payload(self, spec: RunSpec, params: int) -> tuple[float, int, bool]:
        """(share of entries sent, payload bytes, sparse) of the spec's compressor."""
        compression = spec.config().section(CompressionConfig).compression
        name, _, arg = compression.partition(":")
        kind = COMPRESSORS.get(name)
        stated = spec.assumptions.get("density")
        if stated is not None and kind.density != "data":
            raise ValueError(
                f"density= is for compressors whose share the data sets (onebit); "
                f"{compression} sends {'its RATIO' if arg else 'every entry'}"
            )
        if kind.density == "all":  # dense: every entry, no index, no length prefix
            return 1.0, -(-params * kind.value_bits // 8), False
        if kind.density == "param":
            density = float(arg)
        elif stated is None:
            raise ValueError(
                f"{compression} sends the entries above its threshold, a share "
                f"the gradients set: state it, e.g. {spec.label}:density=0.01"
            )
        else:
            density = stated
        if not 0 < density <= 1:
            raise ValueError(f"density must be in (0, 1], got {density:g}")
        return density, costing.compressed_bytes(params, density, kind.value_bits), True

    def predict(self, q: costing.Question) -> costing.Prediction:
        """Compressed payloads to every peer in n−1 sequential rounds (Strom), or to 2 ring
        neighbours; plus encode/decode time per element and per sent element."""
        spec, work, nodes, network, calibration = q
        density, payload, sparse = self._payload(spec, work.params)
        ring = spec.config().section(DecentralizedConfig).topology == "ring"
        net, cal, n = network, calibration, nodes
        peers = min(2, n - 1) if ring else n - 1
        compute = costing.compute_seconds(work, n, cal)
        # each round: the length then the payload, both ways at once; rounds in sequence
        latency = 2 * peers * net.alpha
        bandwidth = peers * payload * net.beta
        sent = work.params * density
        if sparse:  # encode scans every entry and codes the sent ones; each payload decoded
            encode = work.params * cal.seconds_per_encode + sent * cal.seconds_per_encode_sent
            decode = work.params * cal.seconds_per_decode + sent * cal.seconds_per_decode_sent
        else:  # a dense cast: no coding; each received fp32 tensor is added (γ per byte)
            encode, decode = 0.0, 4 * work.params * costing.gamma_of(net, cal)
        coding = encode + peers * decode
        comm = latency + bandwidth + coding
        local = "encode" if sparse else "reduction"
        bound = costing.bound_of({"latency": latency, "bandwidth": bandwidth, local: coding})
        what = "2 neighbours" if ring else f"n−1 = {peers} peers"
        reason = {
            "latency": f"latency-bound: 2 messages to each of {what} × α",
            "bandwidth": f"bandwidth-bound: {costing.mb(payload)} to each of {what}",
            "encode": f"codec-bound: 1 encode and {peers} decodes of {work.params:,} entries, "
            f"{sent:,.0f} sent",
            "reduction": f"reduction-bound: {peers} received tensors of {work.params:,} "
            "entries added",
        }[bound]
        note = "gossip: replicas differ" if ring else "error feedback"
        if spec.assumptions.get("density") is not None:
            note += f"; assumes {density:g} of the entries sent"
        return costing.finish(
            spec.label, n, compute, comm, peers * payload, 2 * peers, bound, reason, work, cal, note
        )
