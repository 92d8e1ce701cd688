"""4-bit block codes: within half a step of the grid, zeros exact, the stated size."""

from __future__ import annotations

import pytest
import torch

from disttrain.compression import blockquant


@pytest.mark.parametrize("numel", [1, 63, 64, 65, 1000, 4096])
def test_decode_is_within_half_a_step_and_the_size_is_stated(numel: int) -> None:
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel)) * 3
    payload = blockquant.encode(x)
    assert payload.dtype == torch.uint8 and payload.numel() == blockquant.payload_bytes(numel)
    got = blockquant.decode(payload, numel)
    padded = torch.zeros(-(-numel // 64) * 64)
    padded[:numel] = x
    step = (padded.view(-1, 64).abs().amax(1) / 7).repeat_interleave(64)[:numel]
    assert torch.all((got - x).abs() <= step / 2 + 1e-6)  # round to nearest on s·(-7..7)
    # each block's largest magnitude is on the grid: exact up to the scale's rounding
    i = int(x[:64].abs().argmax())
    torch.testing.assert_close(got[i], x[i], rtol=1e-6, atol=0)


def test_zero_blocks_and_zeros_are_exact_and_bytes_are_seven_times_fewer() -> None:
    x = torch.zeros(200)
    x[70] = -2.5
    got = blockquant.decode(blockquant.encode(x), 200)
    assert torch.equal(got, x)
    assert blockquant.payload_bytes(64_000) * 7.1 < 4 * 64_000  # 36 bytes per 64 entries
    with pytest.raises(ValueError, match="int4 payload"):
        blockquant.decode(torch.zeros(5, dtype=torch.uint8), 200)
