"""One GPU: disttrain's trainer against a plain PyTorch loop (tokens/s, ratio, MFU).

    disttrain bench one-gpu [--model gpt2-small] [--seq-len 1024] [--batch-size 16]
                            [--steps 120] [--warmup 20] [--rounds 2] [--precision bf16]
                            [--no-check-finite] [--compile inductor] [--json FILE]

Runs, alternately ``--rounds`` times each: a plain loop (the model from the same
factory and seed, ``torch.optim.Adam``, autocast, each batch indexed on the host,
pinned and copied, ``loss.item()`` every step as nanoGPT logs it) in this process,
and ``disttrain train --device cuda --workers 1`` with the same model, data, batch,
precision, optimizer and ``--compile`` setting (the loop's forward compiled the same
way, :func:`disttrain.train.compiled.compile_forward`). Both are timed the same way, from
the end of step ``warmup`` to the end of the last step (each step ends on its
``loss.item()``), so start-up, compiling and the first steps' kernel selection count in
neither. Prints tokens/s of each, their
ratio (trainer / plain, the medians), and the MFU: model FLOPs per token (6 x the
parameters that multiply, plus 12 x layers x context x width for attention: PaLM's
appendix B) x tokens/s over the card's peak dense bf16 FLOP/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

__all__ = ["add_arguments", "run"]

#: The run's settings, written with its figures.
SETTINGS = (
    "model",
    "batch_size",
    "seq_len",
    "precision",
    "steps",
    "warmup",
    "check_finite",
    "compile",
)
#: Peak dense bf16 tensor-core FLOP/s by card name (NVIDIA's data sheets; SXM parts).
PEAK_BF16 = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="gpt2-small")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--warmup", type=int, default=20, help="steps left out of the timing")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--precision", default="bf16", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument(
        "--check-finite",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the trainer's per-step gradient check (its default: on)",
    )
    parser.add_argument(
        "--compile",
        default="none",
        choices=("none", "inductor", "aot_eager"),
        help="torch.compile both the plain loop's model and the trainer's (--compile)",
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=0.0,
        help="the card's peak bf16 TFLOP/s (default: from its name)",
    )
    parser.add_argument("--json", default="", help="write the figures to this file")


def _data(args: argparse.Namespace) -> Any:
    from disttrain.data.datasets import pycode

    # enough windows that the timed steps stay inside one epoch (no evaluation among them)
    windows = int(args.steps * args.batch_size / 0.85) + 1
    return pycode(windows * args.seq_len + 1, args.seq_len)


def _steady(times: list[float], warmup: int, tokens_per_step: int) -> float:
    """Tokens/s from the end of step ``warmup`` to the end of the last step."""
    return (len(times) - warmup) * tokens_per_step / (times[-1] - times[warmup - 1])


def _plain(args: argparse.Namespace, data: Any) -> list[float]:
    """The plain loop's step end times (seconds)."""
    import torch
    from torch.nn import functional as F

    from disttrain.models import build_model
    from disttrain.train.compiled import compile_forward

    torch.manual_seed(0)
    model = compile_forward(build_model(args.model, data).cuda(), args.compile)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    scaler = torch.amp.GradScaler("cuda", enabled=args.precision == "fp16")
    gen = torch.Generator().manual_seed(0)
    ends: list[float] = []
    for _ in range(args.steps):
        idx = torch.randint(len(data.x_train), (args.batch_size,), generator=gen)
        x = data.x_train[idx].pin_memory().cuda(non_blocking=True)
        y = data.y_train[idx].pin_memory().cuda(non_blocking=True)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        loss.item()
        ends.append(time.perf_counter())
    del model, opt
    torch.cuda.empty_cache()
    return ends


def _trainer(args: argparse.Namespace, chars: int, check_finite: bool) -> list[float]:
    """``disttrain train``'s step end times (metrics.jsonl's wall_seconds, one line a step)."""
    from disttrain.launch.commands import train_run

    summary = train_run(
        {
            "device": "cuda",
            "workers": 1,
            "model": args.model,
            "dataset": "pycode",
            "seq_len": args.seq_len,
            "pycode_chars": chars,
            "batch_size": args.batch_size,
            "max_steps": args.steps,
            "epochs": 1,
            "precision": args.precision,
            "optimizer": "adam",
            "lr": args.lr,
            "check_finite": check_finite,
            "compile": args.compile,
        },
        timeout=900,
    )
    lines = [m for m in summary["metrics"] if "wall_seconds" in m and "test_loss" not in m]
    return [float(m["wall_seconds"]) for m in sorted(lines, key=lambda m: m["step"])]


def run(args: argparse.Namespace) -> int:
    import torch

    from disttrain.comm.errors import UsageError
    from disttrain.models import build_model
    from disttrain.models.gpt import flops_per_token

    if not torch.cuda.is_available():
        raise UsageError("bench one-gpu needs a CUDA device")
    data = _data(args)
    chars = int((len(data.x_train) + len(data.x_test)) * args.seq_len) + 1
    tokens = args.batch_size * args.seq_len
    plain: list[float] = []
    ours: list[float] = []
    unchecked: list[float] = []  # the trainer without its per-step finite check (a sync)
    for r in range(args.rounds):
        plain.append(_steady(_plain(args, data), args.warmup, tokens))
        ours.append(_steady(_trainer(args, chars, args.check_finite), args.warmup, tokens))
        if args.check_finite:
            unchecked.append(_steady(_trainer(args, chars, False), args.warmup, tokens))
        print(
            f"round {r + 1}: plain {plain[-1]:,.0f} tokens/s, disttrain {ours[-1]:,.0f}"
            + (f", --no-check-finite {unchecked[-1]:,.0f}" if unchecked else ""),
            flush=True,
        )
    name = torch.cuda.get_device_name()
    peak = args.peak_tflops * 1e12 or next((v for k, v in PEAK_BF16.items() if k in name), 0.0)
    per_token = flops_per_token(build_model(args.model, data), args.seq_len)
    ratio = statistics.median(o / p for o, p in zip(ours, plain, strict=True))
    mfu = statistics.median(ours) * per_token / peak if peak else float("nan")
    mfu_plain = statistics.median(plain) * per_token / peak if peak else float("nan")
    result = {
        "device": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        **{k: getattr(args, k) for k in SETTINGS},
        "plain_tokens_per_s": plain,
        "disttrain_no_check_finite_tokens_per_s": unchecked,
        "disttrain_tokens_per_s": ours,
        "ratio": ratio,
        "flops_per_token": per_token,
        "peak_flops": peak,
        "mfu": mfu,
        "mfu_plain": mfu_plain,
    }
    print(
        f"{name}: disttrain / plain loop (paired, median) {ratio:.3f}; "
        f"MFU disttrain {mfu:.1%}, plain {mfu_plain:.1%} "
        f"({per_token / 1e9:.2f} GFLOP/token, peak {peak / 1e12:.0f} TFLOP/s)"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0
