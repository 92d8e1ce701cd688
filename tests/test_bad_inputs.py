"""The bad-input matrix: every case exits 2 with one line naming the problem, before any worker.

Each row is (id, a builder of the argv given a scratch folder, a substring the
message must contain). The CLI runs in-process (``disttrain.cli.main``) with
the launcher replaced by a trap, so "before any worker starts" is checked, not
assumed. docs/errors.md lists the same cases (bad parameter-server wire frames:
tests/ps/test_bad_frames.py).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from disttrain import checkpoint, cli

REPO = Path(__file__).resolve().parents[1]
Argv = Callable[[Path], list[str]]


# --- scratch inputs ---------------------------------------------------------------------
def _toml(text: str) -> Argv:
    def build(tmp: Path) -> list[str]:
        (tmp / "run.toml").write_text(text)
        return ["--config", str(tmp / "run.toml")]

    return build


def _good_arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "x_train": rng.normal(size=(64, 4)).astype(np.float32),
        "y_train": rng.integers(0, 3, 64),
        "x_test": rng.normal(size=(16, 4)).astype(np.float32),
        "y_test": rng.integers(0, 3, 16),
    }


def _npz(**change: Any) -> Argv:
    """A data file: the good arrays with ``change`` applied (None removes a key)."""

    def build(tmp: Path) -> list[str]:
        arrays = {**_good_arrays(), **change}
        arrays = {k: v for k, v in arrays.items() if v is not None}
        np.savez(tmp / "data.npz", **arrays)
        return ["--dataset", str(tmp / "data.npz")]

    return build


def _earlier_results(tmp: Path) -> list[str]:
    """An --out holding what a finished run leaves (no checkpoints): not replaced silently."""
    (tmp / "earlier").mkdir()
    (tmp / "earlier" / "summary.json").write_text("{}")
    return ["--out", str(tmp / "earlier")]


def _file(name: str, content: bytes, flag: str) -> Argv:
    def build(tmp: Path) -> list[str]:
        (tmp / name).write_bytes(content)
        return [flag, str(tmp / name)]

    return build


class Exploit:
    """A pickle that would create a folder when unpickled: weights_only must refuse it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))


def _checkpoint(kind: str) -> Argv:
    """An earlier run's --out with a checkpoint at step 4 that is bad in the way ``kind`` says."""

    def build(tmp: Path) -> list[str]:
        root = tmp / "earlier"
        if kind == "missing":
            return ["--resume", str(root)]
        root.mkdir()
        if kind == "empty":
            return ["--resume", str(root)]
        state: dict[str, Any] = {"model": {"w": torch.ones(3)}}
        if kind == "zero-stage":  # ZeRO stage 2 shards (of 2 workers, one 3-element group)
            state["strategy"] = {
                "stage": 2,
                "world_size": 2,
                "group_numels": [3],
                "shards": [torch.ones(2)],
            }
        checkpoint.save(str(root), 4, 0, 4 if kind == "world" else 2, state)
        part = next((root / "checkpoints").glob(".step-00000004.*.tmp/rank-00000"))
        if kind == "foreign":  # a state.json without our format tag
            (part / "state.json").write_text(json.dumps({"format": "other", "state": {"v": 1}}))
        elif kind == "truncated":
            data = part / "__0_0.distcp"
            data.write_bytes(data.read_bytes()[:40])
        elif kind == "garbage":
            (part / ".metadata").write_bytes(b"not a checkpoint at all\n" * 4)
        elif kind == "pickle":  # DCP pickles its index: ours must not run what it names
            (part / ".metadata").write_bytes(pickle.dumps(Exploit(str(tmp / "pwned"))))
        if kind == "other-model":  # what a run of --model cnn records (train/saver.py)
            checkpoint.commit(
                str(root),
                4,
                settings={"model": "cnn", "dataset": "digits", "strategy": "allreduce"},
            )
        elif kind != "uncommitted":
            checkpoint.commit(str(root), 4)
        if kind == "two-runs":  # another run's step 6 in the same folder
            checkpoint.save(str(root), 6, 0, 2, {"model": {"w": torch.ones(3)}}, run="b" * 32)
            checkpoint.commit(str(root), 6, run="b" * 32)
        if kind == "world":  # a strategy whose layout depends on the worker count
            return ["--resume", str(root), "--strategy", "pipeline"]
        if kind in ("zero-stage", "zero-foreign"):  # zero: shards of stage 2 / of no stage
            return ["--resume", str(root), "--strategy", "zero", "--zero-stage", "3"]
        if kind == "complete":  # the checkpoint's step 4 is this run's last
            return ["--resume", str(root), "--max-steps", "4"]
        return ["--resume", str(root)]

    return build


def _out_of_an_earlier_run() -> Argv:
    """An --out holding an earlier run's committed checkpoint (step 4 of run aaaa...)."""

    def build(tmp: Path) -> list[str]:
        root, run = tmp / "earlier", "a" * 32
        for rank in (0, 1):
            checkpoint.save(str(root), 4, rank, 2, {"model": {"w": torch.ones(3)}}, run=run)
        checkpoint.commit(str(root), 4, run=run)
        return ["--out", str(root)]

    return build


FACTORIES = """
import torch
NOT_CALLABLE = 3
def raises():
    raise RuntimeError("factory exploded")
def returns_int():
    return 7
def good():
    return torch.nn.Sequential(torch.nn.Linear(64, 10))
def pairs():
    x = torch.randn(64, 4)
    return torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
def ragged():
    return [torch.zeros(i + 1) for i in range(64)]
def regressor():
    return torch.nn.Linear(4, 1)
def dict_output():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.f = torch.nn.Linear(4, 1)
        def forward(self, x):
            return {"prediction": self.f(x)}
    return M()
def elementwise(out, y):
    return (out - y) ** 2
def plain():
    return torch.nn.Linear(64, 10)
def flat_lm():
    return torch.nn.Sequential(
        torch.nn.Embedding(256, 4), torch.nn.Flatten(), torch.nn.Linear(256, 10)
    )
"""


def _model(spec: str, *more: str) -> Argv:
    def build(tmp: Path) -> list[str]:
        (tmp / "userfactories.py").write_text(FACTORIES)
        (tmp / "explodes_on_import.py").write_text("raise ImportError('broken on purpose')\n")
        return ["--model", spec, *more]

    return build


def _flags(*argv: str) -> Argv:
    return lambda tmp: list(argv)


#: three workers that may shrink to two (a batch both counts split)
SHRINK3 = ("--workers", "3", "--batch-size", "60", "--min-workers", "2")


# --- the matrix -------------------------------------------------------------------------
CASES: list[tuple[str, Argv, str]] = [
    # command line
    ("unknown-flag", _flags("--wrokers", "2"), "unrecognized arguments: --wrokers"),
    ("int-flag-not-int", _flags("--epochs", "ten"), "--epochs: invalid int value"),
    ("choice-flag", _flags("--optimizer", "adagrad"), "--optimizer: invalid choice"),
    ("workers-zero", _flags("--workers", "0"), "--workers must be positive"),
    ("batch-not-divisible", _flags("--batch-size", "63"), "not divisible by the 2 workers"),
    ("negative-lr", _flags("--lr", "-0.1"), "--lr must be positive"),
    ("nan-lr", _flags("--lr", "nan"), "--lr must be"),
    ("zero-timeout", _flags("--timeout", "0"), "--timeout must be positive"),
    ("inf-timeout", _flags("--timeout", "inf"), "--timeout must be"),
    ("unknown-strategy", _flags("--strategy", "magic"), "'magic': unknown strategy"),
    (
        "unknown-model",
        _flags("--model", "resnet999"),
        "--model 'resnet999': unknown model; choose one of cnn, gpt, gpt2-small, mlp",
    ),
    ("unknown-dataset", _flags("--dataset", "imagenet"), "unknown dataset 'imagenet'"),
    ("restarts-without-ckpt", _flags("--max-restarts", "1"), "needs --checkpoint-every"),
    ("fault-step-0", _flags("--inject-fault", "kill:rank=1:step=0"), "steps count from 1"),
    ("nnodes-without-rdzv", _flags("--nnodes", "2"), "needs --rdzv-endpoint"),
    (
        "other-dataset-setting",
        _flags("--synthetic-size", "100"),
        "--synthetic-size is read only with --dataset synthetic (this run: --dataset digits)",
    ),
    (
        "membership-shm",
        _flags("--algorithm", "shm", "--max-workers", "3", "--batch-size", "60"),
        "--max-workers 3 with shm: its shared-memory segment is set up for one membership",
    ),
    (
        "fp16-only-setting",
        _flags("--loss-scale", "1024"),
        "--loss-scale is read only with --precision fp16 (this run: --precision fp32)",
    ),
    (
        "rdzv-port",
        _flags("--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:notaport"),
        "the port must be 1..65535",
    ),
    (
        "rdzv-host",
        _flags("--nnodes", "2", "--rdzv-endpoint", "nohost.invalid:29400"),
        "cannot resolve host 'nohost.invalid'",
    ),
    ("node-rank-outside", _flags("--node-rank", "3"), "--node-rank 3 is outside"),
    ("batch-bigger-than-data", _flags("--batch-size", "4096"), "larger than the 1437"),
    ("cuda-without-gpu", _flags("--device", "cuda"), "no CUDA device"),
    (
        "ray-address-without-ray",
        _flags("--ray-address", "h:1"),
        "--ray-address needs --launcher ray",
    ),
    (
        "ray-with-servers",
        _flags("--launcher", "ray", "--strategy", "ps"),
        "--launcher ray runs --workers training processes",
    ),
    (
        "ray-nnodes",
        _flags("--launcher", "ray", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29400"),
        "--launcher ray decides where its workers run",
    ),
    # config files
    ("toml-missing", lambda tmp: ["--config", str(tmp / "nope.toml")], "config file not found"),
    ("toml-syntax", _toml("workers = = 2\n"), "is not valid TOML"),
    ("toml-unknown-key", _toml("wrokers = 2\n"), "unknown key 'wrokers'"),
    ("toml-wrong-type", _toml('workers = "two"\n'), "'workers' must be int"),
    ("toml-bad-choice", _toml('optimizer = "adagrad"\n'), "--optimizer must be one of"),
    ("toml-table", _toml("[train]\nworkers = 2\n"), "unknown key 'train'"),
    ("toml-binary", _file("run.toml", b"\xff\xfe\x00bin", "--config"), "is not valid TOML"),
    # path flags, checked before anything is built (the refused run creates nothing)
    ("out-unwritable", _flags("--out", "/proc/x"), "--out /proc/x: cannot write in /proc ("),
    ("out-a-file", _file("f", b"x", "--out"), "exists and is not a folder"),
    (
        "tensorboard-unwritable",
        _flags("--tensorboard", "/proc/tb"),
        "--tensorboard /proc/tb: cannot write in /proc (",
    ),
    ("timeline-a-folder", lambda tmp: ["--timeline", str(tmp)], "is a folder; name a .json file"),
    ("out-earlier-results", _earlier_results, "already holds an earlier run's results (summary"),
    # 200 default workers need about 49 GB: more than this 24 GB kind of machine has
    (
        "workers-over-memory",
        lambda tmp: ["--workers", "200", "--batch-size", "400"],
        "200 worker processes need about",
    ),
    ("toml-bad-value", _toml("lr = -1.0\n"), "--lr must be positive"),
    # data files
    ("npz-missing-file", lambda tmp: ["--dataset", str(tmp / "d.npz")], "data file not found"),
    ("npz-not-a-zip", _file("d.npz", b"hello", "--dataset"), "not a zip archive"),
    ("npz-missing-key", _npz(y_test=None), "lacks the array(s) y_test"),
    ("npz-1d-x", _npz(x_train=np.zeros(64, np.float32)), "x_train must be (N, ...)"),
    ("npz-length-mismatch", _npz(y_train=np.zeros(63, np.int64)), "y_train (N,)"),
    ("npz-empty", _npz(x_test=np.zeros((0, 4), np.float32), y_test=np.zeros(0, np.int64)), "N > 0"),
    (
        "npz-float-labels",
        _npz(y_train=np.full(64, 0.5)),
        "y_train must hold integer class labels, got dtype float64; save them as "
        "y_train.astype(np.int64)",
    ),
    ("npz-negative-label", _npz(y_test=np.full(16, -1)), "y_test holds label -1; labels are class"),
    ("npz-huge-label", _npz(y_train=np.full(64, 10**9)), "label 1000000000"),
    ("npz-nan", _npz(x_train=np.full((64, 4), np.nan, np.float32)), "x_train holds NaN or Inf"),
    ("npz-inf", _npz(x_test=np.full((16, 4), np.inf, np.float32)), "x_test holds NaN or Inf"),
    ("npz-text", _npz(x_train=np.full((64, 4), "a")), "x_train must hold numbers"),
    ("npz-shape-mismatch", _npz(x_test=np.zeros((16, 5), np.float32)), "different sample shapes"),
    ("npz-object", _npz(x_train=np.array([[None]] * 64, dtype=object)), "cannot read"),
    # a user's data set, loss and metric (--dataset/--loss/--metric module:function)
    ("user-dataset-folder", lambda tmp: ["--dataset", str(tmp)], "is a folder; --dataset takes"),
    (
        "user-dataset-not-a-dataset",
        _model("good", "--dataset", "userfactories:returns_int"),
        "returned a int as its train set",
    ),
    (
        "user-dataset-missing-function",
        _model("good", "--dataset", "userfactories:nope"),
        "--dataset 'userfactories:nope': userfactories has no function 'nope'",
    ),
    (
        "user-dataset-ragged",
        _model("userfactories:regressor", "--dataset", "userfactories:ragged"),
        "its samples do not stack into a batch",
    ),
    (
        "user-model-builtin",
        _model("mlp", "--dataset", "userfactories:pairs"),
        "--model mlp is shaped for the built-in data sets",
    ),
    (
        "user-loss-non-scalar",
        _model(
            "userfactories:regressor",
            "--dataset",
            "userfactories:pairs",
            "--loss",
            "userfactories:elementwise",
        ),
        "the loss must be a scalar tensor, got shape",
    ),
    (
        "user-loss-missing",
        _model(
            "userfactories:regressor",
            "--dataset",
            "userfactories:pairs",
            "--loss",
            "userfactories:mse",
        ),
        "--loss 'userfactories:mse': userfactories has no function",
    ),
    (
        "user-output-unreadable",
        _model("userfactories:dict_output", "--dataset", "userfactories:pairs"),
        "the loss (cross-entropy) cannot read the model's output dict",
    ),
    (
        "user-loader-workers-unread",
        _flags("--loader-workers", "2"),
        "--loader-workers is read only with --dataset module:function",
    ),
    # the messages a user's trial found misleading (issue 49)
    (
        "tensor-no-pair",
        _model("userfactories:good", "--strategy", "tensor"),
        "--tensor-mode megatron slices Linear layers in pairs",
    ),
    (
        "hybrid-not-sequential",
        _model("userfactories:plain", "--strategy", "hybrid", "--workers", "4", "--tp", "2"),
        "--strategy hybrid cuts a model by a tensor-parallel plan",
    ),
    (
        "lm-logits-shape",
        _model("userfactories:flat_lm", "--dataset", "pycode", "--pycode-chars", "20000"),
        "but the loss needs (batch, 64, 256) logits for labels",
    ),
    # checkpoints
    ("resume-missing", _checkpoint("missing"), "no such folder"),
    ("resume-no-checkpoint", _checkpoint("empty"), "no complete checkpoint"),
    ("resume-uncommitted", _checkpoint("uncommitted"), "no complete checkpoint"),
    ("resume-foreign", _checkpoint("foreign"), "no disttrain-checkpoint-v2-dcp tag"),
    ("resume-truncated", _checkpoint("truncated"), "is not a disttrain checkpoint"),
    ("resume-garbage", _checkpoint("garbage"), "is not a disttrain checkpoint"),
    ("resume-pickle-code", _checkpoint("pickle"), "refused global posix.mkdir"),
    (
        "resume-world-size",
        _checkpoint("world"),
        "cannot change its layout: resume with --workers 4",
    ),
    ("resume-two-runs", _checkpoint("two-runs"), "holds the checkpoints of 2 runs"),
    (
        "resume-other-model",
        _checkpoint("other-model"),
        "its checkpoint was written with --model cnn, this run has --model mlp: resume with",
    ),
    (
        "resume-complete",
        _checkpoint("complete"),
        "run already complete at step 4 (this run's budget: 4 steps); raise --epochs or",
    ),
    (
        "resume-zero-stage",
        _checkpoint("zero-stage"),
        "the checkpoint holds ZeRO stage 2 shards, this run is stage 3: resume with --zero-stage 2",
    ),
    ("resume-zero-foreign", _checkpoint("zero-foreign"), "the checkpoint holds no ZeRO shards"),
    (
        "out-of-another-run",
        _out_of_an_earlier_run(),
        "already holds checkpoints (run aaaaaaaa steps 4): resume that run with --resume",
    ),
    # model factories
    ("factory-no-import", _model("no_such_pkg.models:net"), "cannot import no_such_pkg.models"),
    ("factory-import-raises", _model("explodes_on_import:net"), "broken on purpose"),
    ("factory-no-function", _model("userfactories:missing"), "has no function 'missing'"),
    ("factory-not-callable", _model("userfactories:NOT_CALLABLE"), "no function 'NOT_CALLABLE'"),
    ("factory-raises", _model("userfactories:raises"), "factory exploded"),
    ("factory-not-module", _model("userfactories:returns_int"), "returned int, not an nn.Module"),
    ("factory-no-colon-part", _model("userfactories:"), "package.module:function"),
    ("mlp-on-text", _flags("--model", "mlp", "--dataset", "pycode"), "use --model gpt"),
    ("gpt-on-digits", _flags("--model", "gpt"), "--model gpt needs a language-model"),
    # strategy options
    ("ps-mode", _flags("--strategy", "ps", "--ps-mode", "eventual"), "--ps-mode: invalid choice"),
    ("ps-servers-zero", _flags("--strategy", "ps", "--servers", "0"), "--servers must be positive"),
    ("ps-staleness", _flags("--strategy", "ps", "--staleness-bound", "-1"), "--staleness-bound"),
    ("ps-softsync", _flags("--strategy", "ps", "--softsync", "3"), "--softsync 3 exceeds"),
    ("ps-straggler", _flags("--strategy", "ps", "--straggler", "1"), "use RANK:FACTOR"),
    ("ps-straggler-rank", _flags("--strategy", "ps", "--straggler", "5:2"), "names rank 5"),
    ("ps-heartbeat", _flags("--strategy", "ps", "--ps-worker-timeout", "0.5"), "two heartbeats"),
    (
        "ps-fp16-async",
        _flags("--strategy", "ps", "--precision", "fp16", "--ps-mode", "async"),
        "needs --ps-mode sync",
    ),
    (
        "ps-curve-key-missing",
        _flags("--strategy", "ps", "--ps-curve-key", "/nonexistent/k"),
        "--ps-curve-key /nonexistent/k: cannot read",
    ),
    ("ps-curve-key-garbage", _file("k", b"short\n", "--ps-curve-key"), "not a CURVE secret key"),
    (
        "pipeline-stages-vs-workers",
        _flags("--strategy", "pipeline", "--stages", "3"),
        "--stages 3 needs one worker per stage",
    ),
    (
        "pipeline-more-stages-than-layers",
        _model("userfactories:good", "--strategy", "pipeline", "--workers", "4"),
        "more than the model's 1 layers",
    ),
    (
        "pipeline-microbatches",
        _flags("--strategy", "pipeline", "--microbatches", "5"),
        "--microbatches 5 does not divide",
    ),
    ("pipeline-balance", _flags("--strategy", "pipeline", "--balance", "1,x"), "--balance"),
    (
        "pipeline-balance-idle-rank",
        _flags("--strategy", "pipeline", "--workers", "3", "--balance", "1,3,4"),
        "--balance 1,3,4 leaves rank 0 only layers without parameters",
    ),
    (
        "pipeline-unknown-schedule",
        _flags("--strategy", "pipeline", "--schedule", "zigzag"),
        "--schedule 'zigzag': unknown pipeline schedule; choose one of",
    ),
    (
        "pipeline-interleaved-microbatches",
        _flags("--strategy", "pipeline", "--schedule", "interleaved", "--microbatches", "1"),
        "--schedule interleaved needs --microbatches a multiple of the 2 stages",
    ),
    (
        "pipeline-interleaved-too-many-chunks",
        _flags("--strategy", "pipeline", "--schedule", "interleaved", "--virtual-stages", "9"),
        "x --virtual-stages 9 = 18 stages is more than the model's",
    ),
    (
        "pipeline-virtual-stages-unread",
        _flags("--strategy", "pipeline", "--schedule", "zb1", "--virtual-stages", "3"),
        "--virtual-stages is not used by --strategy pipeline with --schedule zb1",
    ),
    (
        "pipeline-virtual-stages-zero",
        _flags("--strategy", "pipeline", "--virtual-stages", "0"),
        "--virtual-stages must be >= 1, got 0",
    ),
    (
        "pipeline-zb2-few-microbatches",
        _flags(
            "--strategy", "pipeline", "--workers", "4", "--schedule", "zb2", "--microbatches", "2"
        ),
        "--schedule zb2 needs at least as many micro-batches as stages (4), got 2",
    ),
    (
        "hybrid-mesh",
        _flags("--strategy", "hybrid", "--workers", "4", "--dp", "3", "--pp", "2"),
        "--dp 3 x --pp 2 = 6 ranks",
    ),
    ("hybrid-no-inner", _flags("--strategy", "hybrid"), "needs --pp P or --tp T"),
    (
        "tensor-no-split",
        _flags("--strategy", "tensor", "--workers", "3", "--batch-size", "63"),
        "splits into 3 slices",
    ),
    ("compression-spec", _flags("--compression", "topk:many"), "--compression 'topk:many'"),
    ("compression-name", _flags("--compression", "zip"), "choose one of none"),
    (
        "onebit-optimizer",
        _flags(
            "--strategy", "decentralized", "--compression", "onebit:0.01", "--optimizer", "adam"
        ),
        "with --optimizer adam at its default lr does not train",
    ),
    (
        "algorithm-name",
        _flags("--algorithm", "gossip"),
        "--algorithm 'gossip': unknown allreduce algorithm",
    ),
    (
        "allreduce-table",
        _flags("--algorithm", "auto", "--allreduce-table", "4096:ring"),
        "--allreduce-table '4096:ring': end with *:ALGORITHM (any larger size)",
    ),
    (
        "allreduce-table-unread",
        _flags("--algorithm", "native", "--allreduce-table", "4096:ring,*:shm"),
        "--allreduce-table is read only by --algorithm auto",
    ),
    (
        "allreduce-table-no-algorithm",
        _flags("--strategy", "pipeline", "--allreduce-table", "*:shm"),
        "(this run: --strategy pipeline, which reads no --algorithm)",
    ),
    ("localsgd-period", _flags("--strategy", "localsgd", "--period", "0"), "--period must be"),
    ("zero-stage", _flags("--strategy", "zero", "--zero-stage", "4"), "--zero-stage must be 1"),
    (
        "zero-compression",
        _flags("--strategy", "zero", "--compression", "fp16"),
        "--compression is not used by --strategy zero",
    ),
    ("consensus-step", _flags("--consensus-step", "1.5"), "--consensus-step must be in (0, 1]"),
    # settings no chosen component reads (docs/errors.md, "Settings nothing reads")
    (
        "ps-compression",
        _flags("--strategy", "ps", "--compression", "topk:0.01"),
        "--compression is not used by --strategy ps (used by: allreduce, decentralized)",
    ),
    (  # given at its default value (4): refused all the same, as given, not as changed
        "ps-microbatches-default",
        _flags("--strategy", "ps", "--microbatches", "4"),
        "--microbatches is not used by --strategy ps (used by: hybrid, pipeline)",
    ),
    (
        "localsgd-accumulate",
        _flags("--strategy", "localsgd", "--accumulate", "4"),
        "--accumulate is not used by --strategy localsgd (used by: allreduce, zero)",
    ),
    (
        "tensor-period",
        _flags("--strategy", "tensor", "--period", "4"),
        "--period is not used by --strategy tensor (used by: diloco, localsgd)",
    ),
    (
        "pipeline-algorithm",
        _flags("--strategy", "pipeline", "--algorithm", "ring"),
        "--algorithm is not used by --strategy pipeline (used by: allreduce, decentralized, "
        "diloco, hybrid, localsgd, tensor, zero)",
    ),
    (
        "sparse-fusion-mb",
        _flags("--compression", "topk:0.01", "--fusion-mb", "8"),
        "--fusion-mb is not used by --strategy allreduce with --compression topk:0.01",
    ),
    (
        "sparse-no-overlap",
        _flags("--compression", "topk:0.01", "--no-overlap"),
        "--no-overlap is not used by --strategy allreduce with --compression topk:0.01",
    ),
    (
        "sparse-accumulate",
        _flags("--compression", "onebit:0.03", "--accumulate", "2"),
        "--accumulate is not used by --strategy allreduce with --compression onebit:0.03",
    ),
    (
        "sparse-algorithm",
        _flags("--compression", "topk:0.01", "--algorithm", "ring"),
        "--algorithm is not used by --strategy allreduce with --compression topk:0.01",
    ),
    (
        "error-feedback-uncompressed",
        _flags("--no-error-feedback"),
        "--no-error-feedback is not used by --strategy allreduce with --compression none",
    ),
    ("powersgd-rank", _flags("--compression", "powersgd:1.5"), "rank must be a whole number"),
    (
        "powersgd-start-without-powersgd",
        _flags("--compression", "topk:0.01", "--powersgd-start-step", "5"),
        "--powersgd-start-step is not used by --strategy allreduce with --compression topk:0.01",
    ),
    (
        "powersgd-decentralized",
        _flags("--strategy", "decentralized", "--compression", "powersgd:2"),
        "decentralized sends one payload to each neighbour",
    ),
    (
        "diloco-fragments-period",
        _flags("--strategy", "diloco", "--period", "6", "--fragments", "8"),
        "--fragments 8 is more than --period 6",
    ),
    (
        "diloco-fragment-mix-unstreamed",
        _flags("--strategy", "diloco", "--fragment-mix", "0.2"),
        "--fragment-mix is not used by --strategy diloco with --fragments 1",
    ),
    ("diloco-outer-lr", _flags("--strategy", "diloco", "--outer-lr", "0"), "--outer-lr must be"),
    (
        "diloco-average-optimizer-state",
        _flags("--strategy", "diloco", "--average-optimizer-state"),
        "--average-optimizer-state is not used by --strategy diloco",
    ),
    (
        "grad-dtype-removed",
        _flags("--grad-dtype", "fp16"),
        "--grad-dtype was removed: 16-bit gradients are --compression fp16",
    ),
    (
        "ps-softsync-in-sync-mode",
        _flags("--strategy", "ps", "--softsync", "1"),
        "--softsync is not used by --strategy ps with --ps-mode sync",
    ),
    (
        "consensus-step-all-peers",
        _flags("--strategy", "decentralized", "--consensus-step", "0.2"),
        "--consensus-step is not used by --strategy decentralized with --topology all",
    ),
    (
        "hybrid-tensor-mode-with-pp",
        _flags("--strategy", "hybrid", "--pp", "2", "--tensor-mode", "naive"),
        "--tensor-mode is not used by --strategy hybrid with --pp 2",
    ),
    ("fault-kind", _flags("--inject-fault", "explode:rank=0"), "kind must be one of"),
    ("fault-rank-outside", _flags("--inject-fault", "kill:rank=9:step=2"), "names rank 9"),
    ("fault-no-rank", _flags("--inject-fault", "kill:step=2"), "name the rank"),
    ("fault-slow-factor", _flags("--inject-fault", "slow:0.5:rank=0"), "FACTOR must be >= 1"),
    # live shrink (--min-workers, docs/reliability.md)
    ("min-workers-above", _flags("--min-workers", "3"), "between 1 and the 2 workers, got 3"),
    ("min-workers-negative", _flags("--min-workers", "-1"), "between 1 and the 2 workers"),
    (
        "min-workers-strategy",
        _flags("--strategy", "zero", *SHRINK3),
        "only --strategy allreduce goes on without a lost worker (this run: --strategy zero)",
    ),
    (
        "min-workers-batch",
        _flags("--workers", "3", "--batch-size", "63", "--min-workers", "2"),
        "--batch-size 63 must split evenly over every worker count from --min-workers 2 to 3",
    ),
    (
        "min-workers-restarts",
        _flags(*SHRINK3, "--max-restarts", "1", "--checkpoint-every", "2"),
        "--min-workers 2 with --max-restarts: choose one",
    ),
    (
        "min-workers-sparse",
        _flags(*SHRINK3, "--compression", "topk:0.1"),
        "--min-workers with --compression topk:0.1: a failed step's error feedback",
    ),
    (
        "min-workers-launcher",
        _flags("--launcher", "slurm", *SHRINK3),
        "--min-workers 2 needs a single-host job (--launcher local, --nnodes 1)",
    ),
]


class LaunchedAWorker(AssertionError):
    """The launcher was reached: the input was not refused before workers start."""


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    import disttrain.launch.local as local

    def trap(*args: Any, **kwargs: Any) -> None:
        raise LaunchedAWorker("a worker was launched")

    monkeypatch.setattr(local, "launch", trap)
    monkeypatch.syspath_prepend(str(tmp_path))  # the user factories
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _check_one_line(err: str, expect: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert expect in lines[0], lines[0]
    assert lines[0].startswith("disttrain"), lines[0]


def _documented(case: str) -> str:
    """docs/errors.md's message for ``case`` (its third column)."""
    doc = (REPO / "docs" / "errors.md").read_text()
    row = next(line for line in doc.splitlines() if line.startswith(f"| `{case}` |"))
    return row.split(" | ")[2]


def _check_documented_choices(case: str, err: str) -> None:
    """Where docs/errors.md quotes a list of choices, it is today's (the registries grow:
    the lists lacked zero, shm, hierarchical, inf and powersgd once)."""
    for phrase in ("choose one of ", "must be one of "):
        doc = _documented(case)
        if phrase in doc:
            assert err.strip().split(phrase, 1)[1] == doc.split(phrase, 1)[1], (case, err)


@pytest.mark.parametrize(("case", "argv", "expect"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2_before_any_worker(
    case: str, argv: Argv, expect: str, no_launch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = no_launch / "out"
    args = ["train", "--no-progress", "--out", str(out), *argv(no_launch)]
    with pytest.raises(SystemExit) as exit_info:
        sys.exit(cli.main(args))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    _check_one_line(err, expect)
    _check_documented_choices(case, err)
    assert not out.exists(), "nothing should be written for a refused run"
    assert not (no_launch / "pwned").exists(), "unpickling ran code from a checkpoint"


@pytest.mark.parametrize(
    "argv",
    [
        ["--strategy", "pipeline", "--workers", "3", "--microbatches", "4"],
        ["--strategy", "hybrid", "--workers", "6", "--dp", "2", "--pp", "3"],
    ],
    ids=["pipeline-3-stages", "hybrid-dp2-pp3"],
)
def test_a_batch_that_all_stages_share_need_not_split_by_the_worker_count(
    argv: list[str], no_launch: Path
) -> None:
    """64 is not a multiple of 3 or 6, but pipeline stages share each batch: accepted."""
    args = ["train", "--no-progress", "--batch-size", "64", "--out", str(no_launch / "o"), *argv]
    with pytest.raises(LaunchedAWorker):
        cli.main(args)


def test_data_parallel_strategies_still_need_the_batch_to_split(
    no_launch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for strategy in ("allreduce", "localsgd", "decentralized", "ps"):
        args = [
            "train",
            "--no-progress",
            "--strategy",
            strategy,
            "--workers",
            "3",
            "--batch-size",
            "64",
            "--out",
            str(no_launch / strategy),
        ]
        assert cli.main(args) == 2, strategy
        _check_one_line(capsys.readouterr().err, "not divisible by the 3 workers")


def test_the_matrix_is_big_and_its_ids_unique_and_documented() -> None:
    assert len(CASES) >= 40
    assert len({c[0] for c in CASES}) == len(CASES)
    doc = (REPO / "docs" / "errors.md").read_text()
    missing = [cid for cid, *_ in CASES if f"| `{cid}` |" not in doc]
    assert not missing, f"docs/errors.md lacks the cases {missing}"


def test_the_exploit_checkpoint_would_run_code_without_weights_only(tmp_path: Path) -> None:
    """The pickle case can fail: a plain ``torch.load`` of that file does run its code."""
    build = _checkpoint("pickle")
    root = Path(build(tmp_path)[1])
    path = next(root.glob("checkpoints/step-*/rank-*/.metadata"))
    pickle.loads(path.read_bytes())  # what DCP's own FileSystemReader does with it
    assert (tmp_path / "pwned").is_dir()


def test_the_real_command_exits_2_with_one_line(tmp_path: Path) -> None:
    """One case through a real process: the entry point, not only ``main``."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "disttrain", "train", "--workers", "0", "--out", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    _check_one_line(proc.stderr, "--workers must be positive")


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["--strategy", "localsgd", "--accumulate", "4"], "--accumulate is not used by"),
        (["--strategy", "ps", "--compression", "topk:0.01"], "--compression is not used by"),
    ],
    ids=["localsgd-accumulate", "ps-compression"],
)
def test_a_setting_nothing_reads_is_refused_by_the_real_command(
    argv: list[str], expect: str, tmp_path: Path
) -> None:
    """The unused-settings refusal through a real process, before any worker starts."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "disttrain", "train", *argv, "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    _check_one_line(proc.stderr, expect)
    assert not out.exists()
