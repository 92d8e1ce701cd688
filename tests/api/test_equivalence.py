"""``dt.distribute`` on a Hugging Face GPT-2 equals one process, within 1e-5 (fp32).

The model is ``transformers``' own ``GPT2LMHeadModel`` built from a small config (tied
input and output embeddings, no dropout, nothing downloaded); batches are dicts
(``input_ids``, ``labels``) through torch's DataLoader, the loss is the model's own
``outputs.loss``. N workers at global batch B against one plain PyTorch loop at B over
the same global batches: allreduce and ZeRO stages 1-3 on 2 workers, allreduce and
ZeRO-3 on 4, and a script that keeps its own forward and ``optimizer.step()``
(``run.backward``). ZeRO-3 gives bit-identical parameters in two runs.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.harness import SharedWorlds

# one xdist worker runs the module: its shared worlds (and fixtures) once, not once a worker
pytestmark = pytest.mark.xdist_group("api-equivalence")

STEPS, BATCH, SEQ, LR = 20, 8, 16, 1e-3
TOLERANCE = 1e-5


class ByteWindows(torch.utils.data.Dataset):
    """Windows of SEQ bytes of the standard library's source, as a causal LM's dict."""

    def __init__(self) -> None:
        from disttrain.data.datasets import _stdlib_text

        data = torch.frombuffer(bytearray(_stdlib_text(SEQ * 400)), dtype=torch.uint8).long()
        self.windows = data.view(-1, SEQ)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.windows[i], "labels": self.windows[i]}


def gpt2(tied: bool = True) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()  # the config's token ids outside a 256-byte vocabulary
    config = GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=256, n_positions=SEQ,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=tied,
    )  # fmt: skip
    torch.manual_seed(0)
    return GPT2LMHeadModel(config)


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def reference() -> dict[str, torch.Tensor]:
    """One process, the whole global batch, plain AdamW: the state every run must reach."""
    from torch.utils.data import default_collate

    from disttrain.data import GlobalBatchSampler

    data, model = ByteWindows(), gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    for indices in GlobalBatchSampler(len(data), BATCH, 0, 1, 0).epoch(0)[:STEPS]:
        batch = default_collate([data[int(i)] for i in indices])
        opt.zero_grad()
        model(**batch).loss.backward()
        opt.step()
    return _state(model)


def _distributed(strategy: str, settings: dict[str, Any], own_loop: bool) -> Any:
    import disttrain as dt

    data, model = ByteWindows(), gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    run = dt.distribute(model, opt, strategy, batch_size=BATCH, **settings)
    for step, batch in enumerate(run.loader(data, shuffle=True, epoch=0)):
        if step == STEPS:
            break
        if own_loop:  # the user's forward and optimizer step, Accelerate-style
            run.backward(run.model(**batch).loss)
            opt.step()
            opt.zero_grad()
        else:
            run.step(batch)
    whole = run.finish()
    return None if whole is None else _state(whole)


CASES = {
    "allreduce-2": (2, "allreduce", {}, False),
    "zero1-2": (2, "zero", {"zero_stage": 1}, False),
    "zero2-2": (2, "zero", {"zero_stage": 2}, False),
    "zero3-2": (2, "zero", {"zero_stage": 3}, False),
    "zero3-2-again": (2, "zero", {"zero_stage": 3}, False),
    "own-loop-allreduce-2": (2, "allreduce", {}, True),
    "own-loop-zero2-2": (2, "zero", {"zero_stage": 2}, True),
    "allreduce-4": (4, "allreduce", {}, False),
    "zero3-4": (4, "zero", {"zero_stage": 3}, False),
}
WORLDS = SharedWorlds(
    {name: (n, _distributed, (s, kw, own)) for name, (n, s, kw, own) in CASES.items()},
    timeout=240,
)


@pytest.fixture(scope="module")
def expected() -> dict[str, torch.Tensor]:
    return reference()


@pytest.mark.parametrize("case", [c for c in CASES if not c.endswith("again")])
def test_equals_one_process(case: str, expected: dict[str, torch.Tensor]) -> None:
    got = WORLDS.get(case)[0]
    assert set(got) == set(expected)
    worst = max(float((got[k] - expected[k]).abs().max()) for k in expected)
    assert worst <= TOLERANCE, f"{case}: max |difference| {worst:.2e} > {TOLERANCE}"
    assert torch.equal(got["lm_head.weight"], got["transformer.wte.weight"])  # still tied


def test_zero3_is_bit_identical_run_to_run() -> None:
    first, second = WORLDS.get("zero3-2")[0], WORLDS.get("zero3-2-again")[0]
    assert all(torch.equal(first[k], second[k]) for k in first)
