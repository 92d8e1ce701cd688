"""A user's own workloads for `disttrain train --dataset/--model/--loss module:function`
(docs/your-loop.md): a regression from a CSV file with MSE, and Hugging Face GPT-2 on
byte-level text with the model's own loss. Nothing is downloaded: the CSV is written
here on first use, the text is the standard library's source, GPT-2 is built from its
config."""

from __future__ import annotations

import csv
import os
import sysconfig

import torch
from torch.nn import functional as F
from torch.utils.data import Dataset, TensorDataset

CSV = os.path.join(os.path.dirname(os.path.abspath(__file__)), "regression.csv")


def _write_csv(path: str, rows: int = 640) -> None:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(rows, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(rows, 1, generator=g)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow([f"x{i}" for i in range(8)] + ["y"])
        out.writerows(torch.cat([x, y], 1).tolist())
    os.replace(tmp, path)  # workers reading at once see a whole file


def regression() -> tuple[Dataset, Dataset]:
    """(train, test) from the CSV: 8 features, one float target; the last 128 rows held out."""
    if not os.path.exists(CSV):
        _write_csv(CSV)
    with open(CSV, newline="") as fh:
        rows = [[float(v) for v in row] for row in list(csv.reader(fh))[1:]]
    table = torch.tensor(rows)
    x, y = table[:, :8], table[:, 8:]
    return TensorDataset(x[:-128], y[:-128]), TensorDataset(x[-128:], y[-128:])


def regressor(in_features: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(in_features, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
    )


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target)


class ByteText(Dataset):
    """Windows of 32 bytes of the standard library's source, as a causal LM's dict."""

    def __init__(self, start: int, windows: int, seq: int = 32) -> None:
        root = sysconfig.get_paths()["stdlib"]
        with open(os.path.join(root, "argparse.py"), "rb") as fh:
            data = fh.read()[start * seq : (start + windows) * seq]
        self.windows = torch.frombuffer(bytearray(data), dtype=torch.uint8).long().view(-1, seq)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.windows[i], "labels": self.windows[i]}


def byte_text() -> tuple[Dataset, Dataset]:
    return ByteText(0, 512), ByteText(512, 64)


def gpt2() -> torch.nn.Module:
    """transformers' GPT-2 from a small config: 2 blocks, 64 wide, tied embeddings."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()  # the config's token ids outside a 256-byte vocabulary
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=32)
    return GPT2LMHeadModel(config)
