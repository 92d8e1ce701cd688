"""``dt.ShardedOptimizer`` / ``dt.shard_model``: ZeRO from a plain script.

The gathered full state (model and optimizer) of every stage equals an unsharded
model with a plain ``torch.optim.Adam`` trained the same steps on the same global
batches, within 1e-5 (the sums differ only in their order: reduce-scatter vs one
process), and loads into them; then the example runs under ``torchrun`` with 2
processes and must equal one process the same way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional as F

import disttrain as dt
from disttrain.comm.errors import UsageError
from tests.harness import SharedWorlds
from tests.ports import free_port

# one xdist worker runs the module: its shared worlds once, not once a worker (each worker
# given one of RUNS's tests would otherwise spawn that test's world and run all its jobs)
pytestmark = pytest.mark.xdist_group("sharded-api")

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).parent / "torchrun"
STEPS, BATCH, HIDDEN, LR = 6, 48, (24, 16), 0.01


def _batches() -> tuple[Any, list[torch.Tensor]]:
    from disttrain.data import GlobalBatchSampler, load_dataset

    data = load_dataset("digits")
    return data, GlobalBatchSampler(len(data.x_train), BATCH, 0, 1, 0).epoch(0)[:STEPS]


def _reference() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """One process, the whole batch, plain Adam: the state every sharded run must reach."""
    from disttrain.models import mlp

    data, batches = _batches()
    torch.manual_seed(0)
    model = mlp(data.in_features, data.num_classes, HIDDEN)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    for indices in batches:
        opt.zero_grad()
        F.cross_entropy(model(data.x_train[indices]), data.y_train[indices]).backward()
        opt.step()
    return model.state_dict(), opt.state_dict()


def _train_sharded(stage: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """On every rank: this rank's slice of each global batch; rank 0 returns the full state."""
    from disttrain.models import mlp

    data, batches = _batches()
    n, r = dt.size(), dt.rank()
    torch.manual_seed(r)  # different on every rank: the broadcast of rank 0's makes them equal
    model = mlp(data.in_features, data.num_classes, HIDDEN)
    if stage == 3:
        model = dt.shard_model(model)
        opt = dt.ShardedOptimizer(model.parameters(), torch.optim.Adam, lr=LR)
    else:
        opt = dt.ShardedOptimizer(
            model.parameters(), torch.optim.Adam, lr=LR, stage=stage, fusion_mb=0.002
        )  # several buckets
    for indices in batches:
        mine = indices[r * BATCH // n : (r + 1) * BATCH // n]
        opt.zero_grad()
        F.cross_entropy(model(data.x_train[mine]), data.y_train[mine]).backward()
        opt.step()
    full = model.full_state_dict() if stage == 3 else model.state_dict()
    optim = opt.full_state_dict()
    opt.close()
    return {k: v.clone() for k, v in full.items()}, optim


def _check(got: tuple[dict[str, torch.Tensor], dict[str, Any]]) -> None:
    from disttrain.models import mlp

    want_model, want_opt = _reference()
    model, optim = got
    assert model.keys() == want_model.keys()
    for k in want_model:
        assert torch.allclose(model[k], want_model[k], atol=1e-5, rtol=0), k
    assert optim["state"].keys() == want_opt["state"].keys()
    for i, entry in want_opt["state"].items():
        assert entry.keys() == optim["state"][i].keys()
        for key, value in entry.items():
            assert torch.allclose(
                optim["state"][i][key].float(), value.float(), atol=1e-5, rtol=0
            ), (i, key)
    # both load into the plain model and the plain optimizer
    data, _ = _batches()
    plain = mlp(data.in_features, data.num_classes, HIDDEN)
    plain.load_state_dict(model)
    torch.optim.Adam(plain.parameters(), lr=LR).load_state_dict(optim)


SHARDED = [(1, 2), (2, 3), (3, 2), (3, 3)]


@pytest.mark.timeout(400)  # the first case of a size runs that world's jobs
@pytest.mark.parametrize(("stage", "n"), SHARDED)
def test_gathered_full_state_equals_an_unsharded_model(stage: int, n: int) -> None:
    """On 3 ranks the chunks are uneven: stage 3's layers of 24·16 + 16 = 400 and
    16·10 + 10 = 170 elements are not divisible by 3, nor are stage 2's buckets."""
    results = RUNS.get(f"stage {stage} on {n}")
    _check(results[0])
    assert results[1][1] == {} and (results[1][0] == {}) == (stage == 3)  # rank 0's alone


def _misuse() -> list[str]:
    from disttrain.models import mlp

    errors = []
    model = dt.shard_model(mlp(64, 10, (8,)))
    for bad in (
        lambda: model.state_dict(),
        lambda: dt.ShardedOptimizer(list(model.parameters())[:1], torch.optim.SGD, lr=0.1),
        lambda: dt.ShardedOptimizer(model.parameters(), torch.optim.SGD, lr=0.1, stage=2),
        lambda: dt.ShardedOptimizer(mlp(4, 2, (3,)).parameters(), torch.optim.SGD, stage=3),
        lambda: dt.shard_model(model),
    ):
        try:
            bad()
        except UsageError as exc:
            errors.append(str(exc))
    return errors


# --- Hugging Face GPT-2, tied and untied embeddings (dict batches, the model's own loss) ----
GPT_STEPS, GPT_BATCH, GPT_LEN, GPT_LR = 10, 8, 16, 1e-3


def _gpt2(tie: bool) -> torch.nn.Module:
    """A GPT-2 from its config (nothing downloaded), without dropout (every rank and the
    one process then compute the same function)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=64,
        n_positions=32,
        tie_word_embeddings=tie,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    assert (model.lm_head.weight is model.transformer.wte.weight) == tie
    return model


def _train_gpt2(tie: bool, sharded: bool) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Each step's loss (this rank's slice) and the final state_dict (rank 0; {} elsewhere)."""
    n, r = (dt.size(), dt.rank()) if sharded else (1, 0)
    model = _gpt2(tie)
    if sharded:
        model = dt.shard_model(model)
        opt: Any = dt.ShardedOptimizer(model.parameters(), torch.optim.Adam, lr=GPT_LR)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=GPT_LR)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(GPT_STEPS):
        ids = torch.randint(0, 64, (GPT_BATCH, GPT_LEN), generator=gen)
        mine = ids[r * GPT_BATCH // n : (r + 1) * GPT_BATCH // n]
        opt.zero_grad()
        loss = model(input_ids=mine, labels=mine).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    state = model.full_state_dict() if sharded else model.state_dict()
    if sharded:
        opt.close()
    return losses, {k: v.detach().clone() for k, v in state.items()}


def _gpt2_runs(tie: bool) -> dict[str, Any]:
    """Two sharded runs of the same seed, and (rank 0) one process at the whole batch."""
    first, second = _train_gpt2(tie, True), _train_gpt2(tie, True)
    plain = _train_gpt2(tie, False) if dt.rank() == 0 else None
    return {"first": first, "second": second, "plain": plain}


@pytest.mark.timeout(400)
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_sharded_gpt2_equals_one_process_and_repeats_bit_for_bit(tie: bool) -> None:
    """ZeRO-3 on a Hugging Face GPT-2 (its units return ModelOutputs; tied: lm_head.weight
    is transformer.wte.weight, a unit of its own) equals one process at the same global
    batch over 10 Adam steps within 1e-5, and a second run with the same seed is equal
    bit for bit; the tied weights come back tied."""
    ranks = RUNS.get(f"gpt2 {'tied' if tie else 'untied'}")
    plain_losses, plain_state = ranks[0]["plain"]
    losses = [sum(step) / len(ranks) for step in zip(*(r["first"][0] for r in ranks), strict=True)]
    assert max(abs(a - b) for a, b in zip(losses, plain_losses, strict=True)) < 1e-5
    for rank in ranks:  # the same seed: the same floats, every step, every rank
        assert rank["first"][0] == rank["second"][0]
    state, again = ranks[0]["first"][1], ranks[0]["second"][1]
    assert state.keys() == plain_state.keys() == again.keys()
    for k in plain_state:
        assert torch.equal(state[k], again[k]), k
        assert torch.allclose(state[k], plain_state[k], atol=1e-5, rtol=0), k
    if tie:
        assert torch.equal(state["lm_head.weight"], state["transformer.wte.weight"])
    else:
        assert not torch.equal(state["lm_head.weight"], state["transformer.wte.weight"])


# --- units that return a dict, a ModelOutput, a dataclass; what cannot be run -------------
@dataclass
class _Hidden:
    hidden: torch.Tensor
    note: str = "a dataclass"


class _DictBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        return {"hidden": torch.tanh(self.lin(x)), "nothing": None}


class _ModelOutputBlock(_DictBlock):
    def forward(self, x: torch.Tensor) -> Any:
        from transformers.modeling_outputs import BaseModelOutput

        return BaseModelOutput(last_hidden_state=torch.tanh(self.lin(x)))


class _DataclassBlock(_DictBlock):
    def forward(self, x: torch.Tensor) -> Any:
        return _Hidden(torch.tanh(self.lin(x)))


class _StructuredNet(torch.nn.Module):
    """Four units: a dict, a ModelOutput and a dataclass before a plain Linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = _DictBlock(), _ModelOutputBlock(), _DataclassBlock()
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)["hidden"]
        h = self.b(h).last_hidden_state
        return self.head(self.c(h).hidden)


def _train_structured(sharded: bool) -> dict[str, torch.Tensor]:
    n, r = (dt.size(), dt.rank()) if sharded else (1, 0)
    torch.manual_seed(0)
    model: Any = _StructuredNet()
    if sharded:
        model = dt.shard_model(model)
        opt: Any = dt.ShardedOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(2)
    for _ in range(STEPS):
        x, y = torch.randn(8, 8, generator=gen), torch.randn(8, 3, generator=gen)
        opt.zero_grad()
        F.mse_loss(
            model(x[r * 8 // n : (r + 1) * 8 // n]), y[r * 8 // n : (r + 1) * 8 // n]
        ).backward()
        opt.step()
    state = model.full_state_dict() if sharded else model.state_dict()
    return {k: v.detach().clone() for k, v in state.items()}


def _structured_runs() -> dict[str, Any]:
    plain = _train_structured(False) if dt.rank() == 0 else None
    return {"first": _train_structured(True), "second": _train_structured(True), "plain": plain}


@pytest.mark.timeout(400)
def test_units_returning_a_dict_a_model_output_or_a_dataclass_train_as_the_plain_model() -> None:
    """Each unit's backward is gathered again whatever structure holds its output (before,
    only a Tensor or a tuple had the hook: the others' backward read freed storage)."""
    results = RUNS.get("structured outputs")[0]
    for k, want in results["plain"].items():
        assert torch.allclose(results["first"][k], want, atol=1e-6, rtol=0), k
        assert torch.equal(results["first"][k], results["second"][k]), k


class _Boxed:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


class _BoxedBlock(_DictBlock):
    def forward(self, x: torch.Tensor) -> Any:
        return _Boxed(self.lin(x))  # no container anyone can look into


class _BoxedNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = _BoxedBlock()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x).t


class _PeekNet(torch.nn.Module):
    """The root reads a child's weight itself: that unit is gathered only in head's forward."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = torch.nn.Linear(8, 8), torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.body(x), self.head.weight)


class _StashBlock(_DictBlock):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.stashed = self.lin(x)  # what the loss uses: not returned
        return self.lin(x) * 2


class _StashNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = _StashBlock()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.block(x)
        return self.block.stashed


def _refusals() -> list[str]:
    """Each model ZeRO-3 cannot run, trained one step: the UsageError it stops with."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    errors = []
    for net in (_BoxedNet, _PeekNet, _StashNet):
        model = dt.shard_model(net())
        opt = dt.ShardedOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
        try:
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            errors.append(f"{net.__name__}: no error")
        except UsageError as exc:
            errors.append(str(exc))
        assert _get_current_dispatch_mode() is None  # the first forward's guard is gone
        opt.close()
    return errors


@pytest.mark.timeout(400)
def test_a_model_zero3_cannot_run_is_refused_in_one_line() -> None:
    boxed, peek, stash = RUNS.get("refusals")[0]
    assert "returned no tensor that requires grad (_Boxed)" in boxed, boxed
    assert "head.weight is read" in peek and "forward of head," in peek, peek
    assert "block.lin.weight" in stash or "block.lin.bias" in stash, stash
    assert "did not return" in stash, stash
    assert all("\n" not in e for e in (boxed, peek, stash))


#: the runs of this file in one world per size (2 spawns instead of 5: a spawn's start-up
#: costs more than a run; each builds its own model and optimizer). The misuse last: it
#: leaves a sharded model behind.
RUNS = SharedWorlds(
    {
        **{f"stage {stage} on {n}": (n, _train_sharded, (stage,)) for stage, n in SHARDED},
        "gpt2 tied": (2, _gpt2_runs, (True,)),
        "gpt2 untied": (2, _gpt2_runs, (False,)),
        "structured outputs": (2, _structured_runs, ()),
        "refusals": (2, _refusals, ()),
        "misuse": (2, _misuse, ()),
    },
    timeout=350,
)


@pytest.mark.timeout(400)
def test_misuse_is_one_clear_error() -> None:
    errors = RUNS.get("misuse")[0]
    assert len(errors) == 5, errors
    assert "full_state_dict()" in errors[0] and "model.parameters()" in errors[1]
    assert "stage 3" in errors[2] and "dt.shard_model(model) first" in errors[3]


@pytest.mark.timeout(200)
def test_the_example_under_torchrun_equals_one_process(tmp_path: Path) -> None:
    out = tmp_path / "state.pt"
    cmd = [
        str(TORCHRUN),
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "examples/sharded_zero.py",
        "--stage",
        "3",
        "--max-steps",
        str(STEPS),
        "--batch-size",
        str(BATCH),
        "--lr",
        str(LR),
        "--hidden",
        ",".join(map(str, HIDDEN)),
        "--out",
        str(out),
    ]
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}",
    }
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert f"rank 0: {STEPS} steps" in proc.stdout and "world size 2, stage 3" in proc.stdout
    saved = torch.load(out, weights_only=True)
    _check((saved["model"], saved["optimizer"]))
