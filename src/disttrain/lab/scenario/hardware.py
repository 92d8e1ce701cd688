"""Links: the intra-node presets and the inter-node fabrics, each with its source.

Bandwidths are bytes per second, one direction, per GPU for the intra-node link and per
node (all its NICs together) for the network. What NCCL achieves is less than the link's
rate; the fractions below say how much, and where the figure comes from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["FABRICS", "INTRA_PRESETS", "Fabric", "IntraLink", "inter_node"]


@dataclass(frozen=True)
class IntraLink:
    bandwidth: float  # bytes/s one direction per GPU, achieved by NCCL's ring
    latency: float  # seconds per ring step inside the node
    source: str
    #: NCCL's tuner multiplies a ring allreduce's latency across nodes by 1.9 on Volta and
    #: by 1.4 on Ampere and later ("Plateau effect of ring", ncclTopoGetAlgoTime in
    #: https://github.com/NVIDIA/nccl/blob/master/src/graph/tuning.cc); the GPU is known
    #: here only through the intra-node preset, so the NVSwitch A100/H100 ones take 1.4.
    ring_plateau: float = 1.9


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
        NCCL_INTRA_EFFICIENCY * 300e9, 2e-6, "A100 NVLink 3 + NVSwitch: 300 GB/s per direction", 1.4
    ),
    # H100 SXM5 + NVSwitch: 18 NVLink 4 links, 900 GB/s bidirectional (H100 datasheet).
    "nvswitch-h100": IntraLink(
        NCCL_INTRA_EFFICIENCY * 450e9, 2e-6, "H100 NVLink 4 + NVSwitch: 450 GB/s per direction", 1.4
    ),
}


@dataclass(frozen=True)
class Fabric:
    efficiency: float  # share of the line rate NCCL's allreduce reaches per NIC (busbw)
    latency: float  # seconds per network step of a ring (default when the file gives none)
    source: str
    connection_rate: float = 0.0  # bytes/s one NCCL socket connection carries; 0: no limit


#: The inter-node network as NCCL's nccl-tests all_reduce_perf measures it (busbw at large
#: sizes), per NIC, each figure's source in benchmarks/published/README.md, "Inter-node
#: network (issue 53), pre-registered". The latency is NCCL's own tuner's per network step
#: of a ring, Simple protocol (hwLat[NET][RING][SIMPLE] = 14 us, src/graph/tuning.cc,
#: https://github.com/NVIDIA/nccl/blob/master/src/graph/tuning.cc).
FABRICS: dict[str, Fabric] = {
    # GPUDirect RDMA, one NIC beside each 1-2 GPUs: busbw / line rate measured 0.85-0.96
    # (3 x 8 A100, 4 HDR: https://github.com/NVIDIA/nccl-tests/issues/119), 0.86 (2 x 8
    # A100, 4 x 200G: https://github.com/NVIDIA/nccl-tests/issues/175), 0.96 (DGX A100,
    # 8 x 200G, 192 GB/s: https://github.com/NVIDIA/nccl/issues/1576) and 0.96 (DGX-1, 4
    # EDR, 48 GB/s: https://github.com/NVIDIA/nccl-tests/issues/29); the median 0.93.
    "infiniband": Fabric(0.93, 14e-6, "GPUDirect RDMA: median busbw 93 % of line rate"),
    # RoCE: 2 x 8 A100 with 8 x 100G RoCE reach 600 of 800 Gbit/s, which NVIDIA calls
    # "roughly matching our expectation" (https://github.com/NVIDIA/nccl/issues/495).
    "roce": Fabric(0.75, 14e-6, "RDMA over Converged Ethernet: busbw 75 % of line rate"),
    # Kernel TCP sockets: near line rate while the connections keep up (GCP 32 GbE, 1 GPU
    # a node: 30.4-31.4 Gbit/s busbw, 0.95-0.98; 8 rings: 3.75 of 4 GB/s, 0.94; median
    # 0.95, https://github.com/NVIDIA/nccl/issues/209), but one connection carries only
    # ~2.06 GB/s (the same thread: 1 ring, NCCL 2.3.7) and NCCL opens SOCKET_CHANNELS of
    # them per NIC, so 100 Gbit/s delivers ~4 GB/s (4-6 GB/s measured on 4 x 8 V100,
    # https://github.com/NVIDIA/nccl/issues/450); the latency is assumed (socket stack).
    "tcp": Fabric(0.95, 50e-6, "TCP sockets: 95 % of line rate, ~2.06 GB/s a connection", 2.06e9),
}

#: A NIC serving more than GPUS_PER_NIC_WITH_GDR GPUs hangs off the CPU rather than a PCIe
#: switch beside its GPUs (DGX-1 has one NIC per switch of 2 GPUs, DGX A100 one per GPU), so
#: NCCL stages through host memory without GPUDirect RDMA. Measured busbw / line rate with
#: one NIC under 3-8 GPUs: 0.976 (4 x 8 V100, 1 EDR, 12.2 GB/s once configured:
#: https://github.com/NVIDIA/nccl-tests/issues/29), 0.61 (12 x 8 A800, 1 HDR, 15.3 GB/s;
#: NVIDIA: "If the NIC is attached to the CPU getting 16 GB/s is normal", 0.64:
#: https://github.com/NVIDIA/nccl/issues/412), 0.46 (100G IB, GPU across the CPU's link,
#: 5.7 GB/s: https://github.com/NVIDIA/nccl/issues/243); the median 0.61. RDMA fabrics only:
#: sockets always stage through host memory, their share above already measures that.
SHARED_NIC_EFFICIENCY = 0.61
GPUS_PER_NIC_WITH_GDR = 2
#: NCCL's socket transport runs 2 channels between two nodes by default (its log in
#: https://github.com/NVIDIA/nccl-tests/issues/284: "Channel 00/0", "Channel 01/0" via
#: NET/Socket), each its own connection (NCCL_SOCKET_NTHREADS = NCCL_NSOCKS_PERTHREAD = 1).
SOCKET_CHANNELS = 2


def inter_node(fabric: str, line_rate: float, nics: int, gpus_per_node: int) -> tuple[float, float]:
    """(achieved, cap) in bytes/s per node, one direction, for the nodes' allreduce traffic.

    achieved = line_rate * share, share = the fabric's efficiency, or for RDMA at most
    SHARED_NIC_EFFICIENCY when gpus_per_node > GPUS_PER_NIC_WITH_GDR * nics; all the
    collectives sharing a node divide it. cap = SOCKET_CHANNELS * connection_rate * nics is
    what one collective's own connections carry (infinite without a connection limit), so
    TCP's busbw = min(0.95 * line rate, 4.1 GB/s per NIC): 96 % of 10 Gbit/s, 33 % of 100.
    """
    spec = FABRICS[fabric]
    share = spec.efficiency
    if spec.connection_rate == 0 and gpus_per_node > GPUS_PER_NIC_WITH_GDR * max(1, nics):
        share = min(share, SHARED_NIC_EFFICIENCY)
    cap = SOCKET_CHANNELS * spec.connection_rate * max(1, nics)
    return share * line_rate, cap if cap > 0 else math.inf
