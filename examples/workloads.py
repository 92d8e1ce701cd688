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
    """transformers' GPT-2 from a small config: 2 blocks, 64 wide, tied embeddings; 4 heads,
    so that tensor parallelism over up to 4 ranks splits them. No dropout: its masks depend
    on how a batch is cut (per rank, micro-batch, stage, slice), so with it strategies of
    the same mathematics ended 1-4 % apart after 24 steps (tests/api, 2026-12-02)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()  # the config's token ids outside a 256-byte vocabulary
    dropout = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=32, **dropout)
    return GPT2LMHeadModel(config)


def next_byte_loss(output: object, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """A user's own causal-LM loss for GPT-2's dict batches: each byte predicts the next
    (the model's ``output.loss`` shifted by hand): cross-entropy of ``logits[:, :-1]``
    against ``labels[:, 1:]``."""
    logits = output.logits[:, :-1]  # type: ignore[attr-defined]
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"][:, 1:].flatten())


IMAGES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "images")
CLASSES = ("horizontal", "vertical")


def _write_images(root: str, per_class: int = 80, size: int = 16) -> None:
    """PNG files in one folder per class: noisy stripes, horizontal or vertical."""
    from PIL import Image

    g = torch.Generator().manual_seed(11)
    tmp = f"{root}.{os.getpid()}.tmp"
    for label, name in enumerate(CLASSES):
        os.makedirs(os.path.join(tmp, name), exist_ok=True)
        for i in range(per_class):
            period = int(torch.randint(2, 5, (1,), generator=g))
            stripes = (torch.arange(size) // period % 2).float()
            grid = stripes[:, None].expand(size, size) if label == 0 else stripes.expand(size, size)
            pixels = (grid + 0.5 * torch.rand(3, size, size, generator=g)).clamp(0, 1) * 255
            image = pixels.byte().permute(1, 2, 0).numpy()
            Image.fromarray(image).save(os.path.join(tmp, name, f"{i:03d}.png"))
    try:
        os.rename(tmp, root)  # workers writing at once: one folder wins, whole
    except OSError:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


class ImageFolder(Dataset):
    """An image folder (one sub-folder per class) read with PIL, with a random horizontal
    flip as augmentation, as a Hugging Face vision model's dict."""

    def __init__(self, root: str, held_out: bool) -> None:
        self.items = [
            (os.path.join(root, name, f), label)
            for label, name in enumerate(CLASSES)
            for i, f in enumerate(sorted(os.listdir(os.path.join(root, name))))
            if (i % 5 == 0) == held_out  # every fifth image held out
        ]
        self.augment = not held_out

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        from PIL import Image

        path, label = self.items[i]
        with Image.open(path) as image:
            pixels = torch.frombuffer(bytearray(image.convert("RGB").tobytes()), dtype=torch.uint8)
        x = pixels.view(16, 16, 3).permute(2, 0, 1).float() / 255
        if self.augment and torch.rand(()) < 0.5:
            x = x.flip(-1)
        return {"pixel_values": (x - 0.5) / 0.25, "labels": torch.tensor(label)}


def image_folder() -> tuple[Dataset, Dataset]:
    if not os.path.isdir(IMAGES):
        _write_images(IMAGES)
    return ImageFolder(IMAGES, held_out=False), ImageFolder(IMAGES, held_out=True)


def resnet() -> torch.nn.Module:
    """transformers' ResNet from a small config (BatchNorm in every block), 2 classes."""
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=2
    )
    return ResNetForImageClassification(config)
