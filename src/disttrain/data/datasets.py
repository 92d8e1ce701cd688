"""The data sets: digits (scikit-learn's real 8x8 digits), synthetic, pycode, and .npz files.

Everything is built locally and deterministically: nothing is downloaded.
"""

from __future__ import annotations

import os
import sysconfig
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from disttrain.comm.errors import UsageError
from disttrain.config import DataConfig, cache_dir
from disttrain.factories import is_spec

__all__ = ["MAX_CLASSES", "Dataset", "load_dataset"]

#: The most classes an .npz data set may have: a larger label is a corrupt file, not a task.
MAX_CLASSES = 1_000_000


@dataclass(frozen=True)
class Dataset:
    """Tensors of one task. ``task`` is ``classification`` or ``lm`` (next-character)."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    task: str
    num_classes: int

    @property
    def in_features(self) -> int:
        return int(self.x_train[0].numel())


def _split(x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, ...]:
    # A fixed, stratified split: the same train/test sets on every machine and run.
    from sklearn.model_selection import train_test_split

    return tuple(train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y))


def _digits_split() -> tuple[np.ndarray, ...]:
    """(x_train, x_test, y_train, y_test) of the digits, built with scikit-learn."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.data / 16.0).astype(np.float32)  # pixel values are 0..16
    y = bunch.target.astype(np.int64)
    return _split(x, y, 0.2, 0)


#: The digits split's arrays in the cache file, in ``_digits_split``'s order.
_DIGITS_KEYS = ("x_train", "x_test", "y_train", "y_test")


def digits_cache_path() -> str:
    """Where the digits split is kept: per scikit-learn version (its data and split code)."""
    from importlib.metadata import version

    return os.path.join(cache_dir(), f"digits-split-sklearn-{version('scikit-learn')}.npz")


def _cached_digits_split() -> tuple[np.ndarray, ...]:
    """The digits split, from the cache file if there, else built and saved there.

    Importing scikit-learn costs about 0.9 s of CPU in every process of every run (the
    launcher and each worker load the data); the cached arrays load in milliseconds,
    without pickle. A cache that cannot be read or written is rebuilt or skipped.
    """
    path = digits_cache_path()
    try:
        with np.load(path, allow_pickle=False) as cached:
            return tuple(cached[k] for k in _DIGITS_KEYS)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        pass
    arrays = _digits_split()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp.npz"
        named: dict[str, Any] = dict(zip(_DIGITS_KEYS, arrays, strict=True))
        np.savez(tmp, **named)
        os.replace(tmp, path)  # concurrent writers: each file is whole, the last one stays
    except OSError:
        pass
    return arrays


def digits() -> Dataset:
    """scikit-learn's handwritten digits: 1,797 8x8 images, 1,437 train / 360 test."""
    x_tr, x_te, y_tr, y_te = _cached_digits_split()
    tr_x, tr_y, te_x, te_y = (torch.from_numpy(a) for a in (x_tr, y_tr, x_te, y_te))
    return Dataset("digits", tr_x, tr_y, te_x, te_y, "classification", 10)


def synthetic(size: int, dim: int, classes: int) -> Dataset:
    """Gaussian blobs, one per class, from a fixed seed (independent of the training seed)."""
    rng = np.random.default_rng(1234)
    centers = rng.normal(0.0, 1.0, (classes, dim)).astype(np.float32)
    y = rng.integers(0, classes, size).astype(np.int64)
    x = (centers[y] + rng.normal(0.0, 1.0, (size, dim))).astype(np.float32)
    n_test = max(1, size // 5)
    return Dataset(
        "synthetic",
        torch.from_numpy(x[n_test:]),
        torch.from_numpy(y[n_test:]),
        torch.from_numpy(x[:n_test]),
        torch.from_numpy(y[:n_test]),
        "classification",
        classes,
    )


def _stdlib_text(chars: int) -> bytes:
    """The first ``chars`` bytes of the standard library's own .py files, in sorted order."""
    root = sysconfig.get_paths()["stdlib"]
    out = bytearray()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "test", "tests"))
        for name in sorted(filenames):
            if name.endswith(".py"):
                with open(os.path.join(dirpath, name), "rb") as fh:
                    out += fh.read()
                if len(out) >= chars:
                    return bytes(out[:chars])
    return bytes(out)


def pycode(chars: int, seq_len: int) -> Dataset:
    """Next-character prediction on Python source: windows of ``seq_len`` bytes (vocab 256)."""
    data = torch.frombuffer(bytearray(_stdlib_text(chars)), dtype=torch.uint8).long()
    windows = (len(data) - 1) // seq_len
    if windows < 2:
        raise UsageError(f"--pycode-chars {chars} is too small for --seq-len {seq_len}")
    x = data[: windows * seq_len].view(windows, seq_len)
    y = data[1 : windows * seq_len + 1].view(windows, seq_len)
    n_test = max(1, windows // 10)
    return Dataset("pycode", x[n_test:], y[n_test:], x[:n_test], y[:n_test], "lm", 256)


def npz(path: str) -> Dataset:
    """A user's data set: an .npz holding x_train, y_train, x_test, y_test (integer labels)."""
    if os.path.isdir(path):  # an image or shard folder: the user's Dataset reads it
        raise UsageError(
            f"--dataset {path}: is a folder; --dataset takes an .npz file, or "
            "module:function returning a torch Dataset that reads the folder"
        )
    if not os.path.isfile(path):
        raise UsageError(f"data file not found: {path}")
    if not zipfile.is_zipfile(path):  # np.load would take it for a pickle or an .npy
        raise UsageError(f"cannot read {path} as .npz: not a zip archive of .npy arrays")
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except Exception as exc:  # zipfile, format and pickle errors all mean "not our file"
        raise UsageError(f"cannot read {path} as .npz: {exc}") from None
    missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in arrays]
    if missing:
        raise UsageError(f"{path} lacks the array(s) {', '.join(missing)}")
    for part in ("train", "test"):
        x, y = arrays[f"x_{part}"], arrays[f"y_{part}"]
        if x.ndim < 2 or y.ndim != 1 or len(x) != len(y) or len(x) == 0:
            raise UsageError(
                f"{path}: x_{part} must be (N, ...) and y_{part} (N,) with N > 0, "
                f"got {x.shape} and {y.shape}"
            )
        if not np.issubdtype(y.dtype, np.integer):
            raise UsageError(
                f"{path}: y_{part} must hold integer class labels, got dtype {y.dtype}; save "
                f"them as y_{part}.astype(np.int64) (class indices 0..C-1)"
            )
        if y.min() < 0:
            raise UsageError(
                f"{path}: y_{part} holds label {int(y.min())}; labels are class indices 0..C-1"
            )
        if y.max() >= MAX_CLASSES:  # the output layer has one row per class
            raise UsageError(
                f"{path}: y_{part} holds label {int(y.max())}; labels are class indices "
                f"0..C-1 with C <= {MAX_CLASSES}"
            )
        if x.dtype.kind not in "biuf":  # bool, integers, floats; not text, complex or objects
            raise UsageError(f"{path}: x_{part} must hold numbers, got dtype {x.dtype}")
        if x.dtype.kind == "f" and not np.isfinite(x).all():
            raise UsageError(f"{path}: x_{part} holds NaN or Inf values")
    if arrays["x_train"].shape[1:] != arrays["x_test"].shape[1:]:
        raise UsageError(f"{path}: x_train and x_test have different sample shapes")
    classes = int(max(arrays["y_train"].max(), arrays["y_test"].max())) + 1
    tr_x, tr_y, te_x, te_y = (
        torch.from_numpy(arrays[k].astype(np.float32 if k[0] == "x" else np.int64))
        for k in ("x_train", "y_train", "x_test", "y_test")
    )
    return Dataset(os.path.basename(path), tr_x, tr_y, te_x, te_y, "classification", classes)


def load_dataset(data: DataConfig | str) -> Any:
    """The data set a :class:`DataConfig` section names (``cfg.data``), or one by name alone:
    a built-in :class:`Dataset`, or a user's (``module:function``: :mod:`disttrain.data.user`).

    A name alone (``load_dataset("digits")``) takes every other setting's default.
    """
    cfg = DataConfig(dataset=data) if isinstance(data, str) else data
    name = cfg.dataset
    if is_spec(name):
        from disttrain.data.user import load_user_dataset

        return load_user_dataset(name)
    if name == "digits":
        return digits()
    if name == "synthetic":
        return synthetic(cfg.synthetic_size, cfg.synthetic_dim, cfg.synthetic_classes)
    if name == "pycode":
        return pycode(cfg.pycode_chars, cfg.seq_len)
    if name.endswith(".npz") or os.path.sep in name:
        return npz(name)
    raise UsageError(
        f"unknown dataset {name!r}: use digits, synthetic, pycode, a .npz path or "
        "module:function returning a torch Dataset"
    )
