"""Data sets: digits' fixed split, synthetic determinism, pycode windows, .npz validation."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from disttrain.comm.errors import UsageError
from disttrain.config import DataConfig, load
from disttrain.data import load_dataset


def test_digits_is_the_real_sklearn_set_with_a_fixed_split() -> None:
    a, b = load_dataset("digits"), load_dataset("digits")
    assert (len(a.x_train), len(a.x_test)) == (1437, 360)
    assert a.x_train.shape[1] == 64 and a.num_classes == 10
    assert float(a.x_train.max()) <= 1.0
    assert torch.equal(a.x_test, b.x_test)


def test_synthetic_honours_its_settings_and_is_deterministic() -> None:
    settings = DataConfig("synthetic", synthetic_size=500, synthetic_dim=16, synthetic_classes=3)
    a = load_dataset(settings)
    # the run's settings pass the section whole: the same flags give the same data
    b = load_dataset(
        load(
            {
                "dataset": "synthetic",
                "synthetic_size": 500,
                "synthetic_dim": 16,
                "synthetic_classes": 3,
            }
        ).data
    )
    assert len(a.x_train) + len(a.x_test) == 500 and a.in_features == 16
    assert int(a.y_train.max()) < 3 and torch.equal(a.x_train, b.x_train)


def test_pycode_targets_are_the_inputs_shifted_by_one_character() -> None:
    d = load_dataset(DataConfig("pycode", seq_len=32, pycode_chars=20_000))
    assert d.task == "lm" and d.x_train.shape[1] == 32
    assert torch.equal(d.x_train[0, 1:], d.y_train[0, :-1])


def test_npz_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "d.npz"
    x = np.random.default_rng(0).normal(size=(20, 4))
    np.savez(path, x_train=x, y_train=np.arange(20) % 3, x_test=x[:5], y_test=np.arange(5) % 3)
    d = load_dataset(str(path))
    assert d.num_classes == 3 and d.x_train.dtype == torch.float32


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"x_train": np.zeros((4, 2)), "y_train": np.zeros(4, int)}, "lacks the array"),
        (
            {
                "x_train": np.zeros((4, 2)),
                "y_train": np.zeros(3, int),
                "x_test": np.zeros((2, 2)),
                "y_test": np.zeros(2, int),
            },
            "must be",
        ),
        (
            {
                "x_train": np.zeros((4, 2)),
                "y_train": np.full(4, 0.5),
                "x_test": np.zeros((2, 2)),
                "y_test": np.zeros(2, int),
            },
            "got dtype float64; save them as y_train.astype",  # what it got, and the fix
        ),
    ],
)
def test_bad_npz_files_are_usage_errors(tmp_path, arrays, message) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(UsageError, match=message):
        load_dataset(str(path))


def test_a_file_that_is_not_npz_is_a_usage_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "junk.npz"
    path.write_text("not a zip")
    with pytest.raises(UsageError, match="cannot read"):
        load_dataset(str(path))


def test_the_cached_digits_split_is_the_one_sklearn_builds(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from disttrain.data import datasets

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    built = datasets._digits_split()
    first = datasets._cached_digits_split()  # builds and writes the cache
    assert os.path.exists(datasets.digits_cache_path())
    monkeypatch.setattr(datasets, "_digits_split", lambda: pytest.fail("cache not used"))
    again = datasets._cached_digits_split()  # read back from the file
    for a, b, c in zip(built, first, again, strict=True):
        assert a.dtype == c.dtype and np.array_equal(a, b) and np.array_equal(a, c)


def test_a_corrupt_digits_cache_is_rebuilt(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from disttrain.data import datasets

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = datasets.digits_cache_path()
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as fh:
        fh.write(b"not an npz")
    arrays = datasets._cached_digits_split()
    assert [len(a) for a in arrays] == [1437, 360, 1437, 360]
    with np.load(path, allow_pickle=False) as cached:  # rewritten whole
        assert np.array_equal(cached["x_test"], arrays[1])
