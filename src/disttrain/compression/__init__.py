"""L1: gradient/update compressors (casts, top-k, Strom one-bit), error feedback, index coding."""

from disttrain.compression.base import Compressor, Payload, SparseCompressor
from disttrain.compression.casts import BF16, FP16, Identity
from disttrain.compression.config import CompressionConfig
from disttrain.compression.error_feedback import ErrorFeedback
from disttrain.compression.exchange import (
    LENGTH_BYTES,
    CompressionStats,
    all_peers,
    compressed_all_reduce,
    exchange_payloads,
)
from disttrain.compression.index_coding import (
    decode_indices,
    empirical_entropy_bits,
    encode_indices,
)
from disttrain.compression.onebit import OneBit
from disttrain.compression.registry import SPECS, parse
from disttrain.compression.topk import TopK

__all__ = [
    "BF16",
    "FP16",
    "LENGTH_BYTES",
    "SPECS",
    "CompressionConfig",
    "CompressionStats",
    "Compressor",
    "ErrorFeedback",
    "Identity",
    "OneBit",
    "Payload",
    "SparseCompressor",
    "TopK",
    "all_peers",
    "compressed_all_reduce",
    "decode_indices",
    "empirical_entropy_bits",
    "encode_indices",
    "exchange_payloads",
    "parse",
]
