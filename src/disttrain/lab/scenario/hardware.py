"""Links: the intra-node presets and the inter-node fabrics, each with its source.

Bandwidths are bytes per second, one direction, per GPU for the intra-node link and per
node (all its NICs together) for the network. What NCCL achieves is less than the link's
rate; the fractions below say how much, and where the figure comes from.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FABRICS", "INTRA_PRESETS", "Fabric", "IntraLink"]


@dataclass(frozen=True)
class IntraLink:
    bandwidth: float  # bytes/s one direction per GPU, achieved by NCCL's ring
    latency: float  # seconds per ring step inside the node
    source: str


#: NCCL's achieved ring bandwidth inside a node, as a share of the per-GPU link rate:
#: nccl-tests' all_reduce_perf "busbw" on 8 NVLink/NVSwitch A100 is reported at ~200-208
#: GB/s of 300 (~70 %; NVIDIA/nccl-tests issues #149 and #178); on V100 NVLink systems
#: NCCL's ring comes closer to the link rate. 0.8 is taken between the two (assumed).
NCCL_INTRA_EFFICIENCY = 0.8

INTRA_PRESETS: dict[str, IntraLink] = {
    # PCIe 3.0 x16: 8 GT/s x 16 lanes x 128/130 = 15.75 GB/s per direction; GPUs behind one
    # CPU share it through the root complex, so NCCL's ring reaches ~10 GB/s.
    "pcie3": IntraLink(
        10e9, 5e-6, "PCIe 3.0 x16, 15.75 GB/s per direction (PCI-SIG); ~10 GB/s ring"
    ),
    # PCIe 4.0 x16: twice PCIe 3.0.
    "pcie4": IntraLink(
        20e9, 5e-6, "PCIe 4.0 x16, 31.5 GB/s per direction (PCI-SIG); ~20 GB/s ring"
    ),
    # V100 SXM2: 6 NVLink 2 links x 25 GB/s = 150 GB/s per direction (V100 datasheet,
    # "300 GB/s" bidirectional).
    "nvlink-v100": IntraLink(
        NCCL_INTRA_EFFICIENCY * 150e9, 2e-6, "V100 NVLink 2: 6 x 25 GB/s per direction (datasheet)"
    ),
    # A100 SXM4 + NVSwitch: 12 NVLink 3 links, 600 GB/s bidirectional (A100 datasheet).
    "nvswitch-a100": IntraLink(
        NCCL_INTRA_EFFICIENCY * 300e9, 2e-6, "A100 NVLink 3 + NVSwitch: 300 GB/s per direction"
    ),
    # H100 SXM5 + NVSwitch: 18 NVLink 4 links, 900 GB/s bidirectional (H100 datasheet).
    "nvswitch-h100": IntraLink(
        NCCL_INTRA_EFFICIENCY * 450e9, 2e-6, "H100 NVLink 4 + NVSwitch: 450 GB/s per direction"
    ),
}


@dataclass(frozen=True)
class Fabric:
    efficiency: float  # share of the nominal per-node rate an allreduce achieves
    latency: float  # seconds per network hop (default when the file gives none)
    source: str


FABRICS: dict[str, Fabric] = {
    # RDMA with GPUDirect: nccl-tests across three 8-A100 nodes with 4 HDR NICs each report
    # 85-96 GB/s busbw of the 100 GB/s line rate (NVIDIA/nccl-tests issue #119); a few
    # microseconds per network hop.
    "infiniband": Fabric(0.9, 5e-6, "GPUDirect RDMA: ~90 % of line rate (nccl-tests #119)"),
    # RoCE: RDMA over Ethernet; no credit-based flow control, so congestion costs a little
    # more than on InfiniBand.
    "roce": Fabric(0.8, 10e-6, "RDMA over Converged Ethernet: ~80 % of line rate"),
    # Kernel TCP sockets: copies through host memory and the socket stack, so about half
    # the line rate and tens of microseconds a hop (assumed; with them the calibration row
    # fsdp-ibm-t5-11b-256gpu in benchmarks/published is predicted within 6 %).
    "tcp": Fabric(0.5, 50e-6, "TCP/IP sockets: ~50 % of line rate, assumed"),
}
