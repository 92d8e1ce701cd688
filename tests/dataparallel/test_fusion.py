"""Bucket assignment by size (reverse order is the caller's), flatten and unflatten."""

from __future__ import annotations

import torch

from disttrain.dataparallel.fusion import MB, assign_by_size, flatten, make_buckets, unflatten


def _sizes(*numels: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return [torch.zeros(n, dtype=dtype) for n in numels]


def test_buckets_fill_up_to_the_cap_and_keep_order() -> None:
    # 4-byte floats: 10, 10, 10 elements = 40 bytes each, cap 100 bytes -> two per bucket
    assert assign_by_size(_sizes(10, 10, 10, 10, 10), 100) == [[0, 1], [2, 3], [4]]
    assert assign_by_size(_sizes(10, 10, 10), 120) == [[0, 1, 2]]


def test_a_tensor_larger_than_the_cap_gets_its_own_bucket() -> None:
    assert assign_by_size(_sizes(5, 100, 5, 5), 40) == [[0], [1], [2, 3]]


def test_zero_cap_is_one_tensor_per_bucket() -> None:
    assert assign_by_size(_sizes(1, 1, 1), 0) == [[0], [1], [2]]


def test_dtypes_never_share_a_bucket() -> None:
    tensors = [*_sizes(4), *_sizes(4, dtype=torch.float64), *_sizes(4)]
    assert assign_by_size(tensors, MB) == [[0, 2], [1]]


def test_flatten_unflatten_round_trip() -> None:
    tensors = [torch.randn(3, 4), torch.randn(5), torch.randn(2, 2, 2)]
    flat = flatten(tensors)
    assert flat.shape == (12 + 5 + 8,)
    for a, b in zip(unflatten(flat, tensors), tensors, strict=True):
        assert torch.equal(a, b)


def test_bucket_views_alias_the_flat_buffer() -> None:
    params = [torch.zeros(2, 3), torch.zeros(4)]
    (bucket,) = make_buckets(params, MB)
    bucket.views[1].fill_(7.0)
    bucket.views[0][1, 2] = 1.0
    assert bucket.buffer.tolist() == [0, 0, 0, 0, 0, 1, 7, 7, 7, 7]
    assert bucket.nbytes == 40
    assert [v.shape for v in bucket.views] == [p.shape for p in params]
