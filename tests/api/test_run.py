"""A script's run (``dt.distribute``): its own loop, resume, and bad input.

- ``run.backward`` with the script's own forward and ``optimizer.step()`` takes the same
  steps as ``run.step`` for every strategy that lets a script keep them (the data-parallel
  family), and is refused with one line naming ``run.step`` where it cannot be;
- ``run.state_dict()`` mid-epoch, loaded into a fresh run (other initial weights), ends
  exactly where the uninterrupted run ends: on the same worker count, and on another one
  (2 -> 4) for the strategies that reshard;
- an ``IterableDataset`` is split by rank and by loader worker, and its ranks stop
  together when the first one's stream ends (no hang);
- bad input is one line (``UsageError``) naming the piece, before any step.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tests.harness import SharedWorlds

pytestmark = pytest.mark.xdist_group("api-run")

BATCH, EPOCHS, CUT = 32, 2, 11  # 8 steps an epoch: the cut is mid-epoch 1
#: where the 2-rank world leaves its states for the 4-rank world: this test process's
#: folder, handed to both (the module's tests share one xdist worker, ``xdist_group``);
#: named here, made by the first writer and removed at the session's end (every process
#: that imports this module, the ranks included, would otherwise leave a folder of its own;
#: not at the module's end: xdist may run other files' tests between this module's)
STATES = os.path.join(tempfile.gettempdir(), f"disttrain-api-states-{os.getpid()}")


@pytest.fixture(autouse=True, scope="session")
def _states_removed() -> Any:
    yield
    shutil.rmtree(STATES, ignore_errors=True)


def _data() -> Any:
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(3)
    x = torch.randn(256, 6, generator=g)
    return TensorDataset(x, (x.sum(1, keepdim=True) > 0).float())


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))


def _state(model: nn.Module | None) -> dict[str, torch.Tensor] | None:
    return None if model is None else {k: v.detach().clone() for k, v in model.state_dict().items()}


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(out, target)


def _run(strategy: str, settings: dict[str, Any], seed: int = 0) -> Any:
    import disttrain as dt

    model = _model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return dt.distribute(model, opt, strategy, batch_size=BATCH, **settings), opt


def _own_loop(strategy: str, settings: dict[str, Any], own: bool) -> Any:
    run, opt = _run(strategy, settings)
    for epoch in range(EPOCHS):
        for inputs, target in run.loader(_data(), epoch=epoch):
            if own:
                opt.zero_grad()
                run.backward(_loss(run.model(inputs), target))
                opt.step()
            else:
                run.step((inputs, target), _loss)
    return _state(run.finish())


def _train(run: Any, stop: int | None = None) -> Any:
    """Train ``run`` from its epoch; ``stop``: return its state after that many steps."""
    for epoch in range(run.epoch, EPOCHS):
        for batch in run.loader(_data(), epoch=epoch):
            run.step(batch, _loss)
            if run.steps == stop:
                return run.state_dict()
    return _state(run.finish())


def _resumed(strategy: str, settings: dict[str, Any], name: str, states: str) -> Any:
    """The uninterrupted run, then a run cut at CUT and resumed in a fresh run whose model
    starts elsewhere; the cut state is saved for the other worker count."""
    whole = _train(_run(strategy, settings)[0])
    state = _train(_run(strategy, settings)[0], stop=CUT)
    if torch.distributed.get_rank() == 0:
        os.makedirs(states, exist_ok=True)
        torch.save(state, os.path.join(states, f"{name}.pt"))
    resumed = _run(strategy, settings, seed=1)[0]
    resumed.load_state_dict(state)
    return whole, _train(resumed)


def _resharded(strategy: str, settings: dict[str, Any], name: str, states: str) -> Any:
    """The state a 2-rank run saved at CUT, resumed on this world's 4 ranks."""
    state = torch.load(os.path.join(states, f"{name}.pt"), weights_only=True)
    run = _run(strategy, settings, seed=1)[0]
    run.load_state_dict(state)
    return _train(run)


def _refusals() -> dict[str, str]:
    """Each bad input's one line (every rank refuses alike, so no rank waits)."""
    import disttrain as dt
    from disttrain.comm.errors import UsageError

    model, data = _model(), _data()
    tries = {
        "not a module": lambda: dt.distribute("mymodels:mlp", None),
        "unread setting": lambda: dt.distribute(model, None, "allreduce", zero_stage=3),
        "trainer's setting": lambda: dt.distribute(model, None, "allreduce", epochs=3),
        "lr with an optimizer": lambda: dt.distribute(model, _run("allreduce", {})[1], lr=0.1),
        "unknown strategy": lambda: dt.distribute(model, None, "allreduse"),
        "non-scalar loss": lambda: _run("allreduce", {})[0].step(
            data[:8], lambda out, y: (out - y) ** 2
        ),
        "three items": lambda: _run("allreduce", {})[0].step((data[:8][0],) * 3, _loss),
        "pair without a loss": lambda: _run("allreduce", {})[0].step(data[:8]),
        "no loss in the output": lambda: _run("allreduce", {})[0].step(data[:8][0]),
        "own loop on a pipeline": lambda: _run("pipeline", {})[0].backward(torch.zeros(())),
    }
    said = {}
    for name, attempt in tries.items():
        try:
            attempt()
        except UsageError as exc:
            said[name] = str(exc)
        else:
            said[name] = "(accepted)"
    return said


class Shards(torch.utils.data.IterableDataset):
    """20 shards of uneven lengths (10 to 22 samples), each sample (its id and 5 features,
    a target): a stream, as a user's shard files would be."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        ident = 0
        for shard in range(20):
            for _ in range(10 + shard * 7 % 13):
                g = torch.Generator().manual_seed(ident)
                x = torch.cat([torch.tensor([float(ident)]), torch.randn(5, generator=g)])
                yield x, x[1:].sum(0, keepdim=True)
                ident += 1


STREAM_SAMPLES = sum(10 + k * 7 % 13 for k in range(20))


def _stream() -> list[int]:
    """This rank's trained sample ids over one epoch of the stream (2 loader workers)."""
    import multiprocessing

    # the harness's ranks are daemonic (they die with the test); torchrun's, a user's, are
    # not, and only a non-daemonic process may start the DataLoader's worker processes
    multiprocessing.current_process().daemon = False
    run = _run("allreduce", {})[0]
    seen: list[int] = []
    # fork: the harness's start method (forkserver) starts each loader worker as a fresh
    # interpreter, seconds a loader; torchrun's processes fork theirs (torch's default)
    loader = run.loader(Shards(), batch_size=8, num_workers=2, multiprocessing_context="fork")
    for inputs, target in loader:
        seen += [int(i) for i in inputs[:, 0]]
        run.step((inputs, target), lambda out, y: F.mse_loss(out, y))
    run.finish()
    return seen


def _forward_and_checks() -> dict[str, Any]:
    """``forward=`` (the script's own way from a batch to its loss) takes run.step's steps;
    ``check_collectives=True`` switches the checks on, as ``--check-collectives`` does."""
    import disttrain as dt
    from disttrain import collectives
    from disttrain.collectives import base, checks

    run, _ = _run("allreduce", {})
    own = dt.distribute(
        _model(),
        None,
        "allreduce",
        batch_size=BATCH,
        lr=0.1,
        forward=lambda model, batch: _loss(model(batch[0]), batch[1]),
        check_collectives=True,
    )
    checked = (base._length_check, checks.checks_everywhere())
    collectives.check_collectives(False)  # the world's next cases run without them
    for batch in run.loader(_data(), epoch=0):
        run.step(batch, _loss)
    for batch in own.loader(_data(), epoch=0):
        own.step(batch)
    return {"checked": checked, "plain": _state(run.finish()), "forward": _state(own.finish())}


DP_FAMILY = {
    "allreduce": {},
    "zero": {"zero_stage": 2},
    "localsgd": {},
    "diloco": {},
    "decentralized": {},
}
RESHARDS = {"allreduce": {}, "zero": {"zero_stage": 3}}
JOBS: dict[str, tuple[int, Any, tuple[Any, ...]]] = {"refusals": (2, _refusals, ())}
for name, kw in DP_FAMILY.items():
    JOBS[f"step-{name}"] = (2, _own_loop, (name, kw, False))
    JOBS[f"own-{name}"] = (2, _own_loop, (name, kw, True))
for name, kw in {**RESHARDS, "localsgd": {}, "diloco": {}}.items():
    JOBS[f"resume-{name}"] = (2, _resumed, (name, kw, name, STATES))
for name, kw in RESHARDS.items():
    JOBS[f"reshard-{name}"] = (4, _resharded, (name, kw, name, STATES))
JOBS["forward"] = (2, _forward_and_checks, ())
JOBS["stream-2"] = (2, _stream, ())
JOBS["stream-4"] = (4, _stream, ())
WORLDS = SharedWorlds(JOBS, timeout=300)


def _world_of(name: str) -> list[Any]:
    """``name``'s results, the 2-rank world run first (it saves the states the 4-rank
    world's cases resume: a 4-rank case may be this process's first, e.g. under plain
    ``-n N`` rather than the Makefile's ``--dist loadgroup``)."""
    WORLDS.get("refusals")
    return WORLDS.get(name)


@pytest.mark.parametrize("strategy", sorted(DP_FAMILY))
def test_own_loop_takes_the_steps_of_run_step(strategy: str) -> None:
    stepped, own = WORLDS.get(f"step-{strategy}")[0], WORLDS.get(f"own-{strategy}")[0]
    worst = max(float((stepped[k] - own[k]).abs().max()) for k in stepped)
    assert worst <= 1e-6, f"{strategy}: run.backward differs from run.step by {worst:.2e}"


@pytest.mark.parametrize("strategy", ["allreduce", "zero", "localsgd", "diloco"])
def test_resume_mid_epoch_ends_where_the_whole_run_ends(strategy: str) -> None:
    whole, resumed = WORLDS.get(f"resume-{strategy}")[0]
    worst = max(float((whole[k] - resumed[k]).abs().max()) for k in whole)
    assert worst <= 1e-6, f"{strategy}: resumed run differs by {worst:.2e}"


@pytest.mark.parametrize("strategy", sorted(RESHARDS))
def test_resume_on_another_worker_count(strategy: str) -> None:
    whole, _ = WORLDS.get(f"resume-{strategy}")[0]  # 2 ranks throughout
    resharded = _world_of(f"reshard-{strategy}")[0]  # 2 ranks, then 4 from the cut
    worst = max(float((whole[k] - resharded[k]).abs().max()) for k in whole)
    assert worst <= 1e-5, f"{strategy}: 2 -> 4 workers differs by {worst:.2e}"


@pytest.mark.parametrize("world", [2, 4])
def test_a_stream_is_split_by_rank_and_loader_worker_and_ends_together(world: int) -> None:
    """An IterableDataset over 20 uneven shards, 2 loader workers a rank: no sample is
    trained twice, every rank trains the same number of steps (none waits for another),
    and what the first rank to run out leaves untrained is under a batch per loader worker
    of each rank."""
    per_rank = _world_of(f"stream-{world}")
    ids = [i for seen in per_rank for i in seen]
    assert len(ids) == len(set(ids)), "a sample was trained twice"
    steps = {len(seen) // (8 // world) for seen in per_rank}
    assert len(steps) == 1 or max(steps) - min(steps) <= 1, steps
    assert STREAM_SAMPLES - len(ids) < world * 2 * (8 // world), (STREAM_SAMPLES, len(ids))


def test_forward_keyword_and_check_collectives_are_read() -> None:
    got = WORLDS.get("forward")[0]
    assert got["checked"] == (True, True)
    worst = max(float((got["plain"][k] - got["forward"][k]).abs().max()) for k in got["plain"])
    assert worst <= 1e-6, f"forward= differs from run.step(batch, loss_fn) by {worst:.2e}"


EXPECTED = {
    "not a module": "model must be an nn.Module, got str",
    "unread setting": "--zero-stage",
    "trainer's setting": "epochs= is not a setting of a script's run",
    "lr with an optimizer": "lr= configures the default optimizer",
    "unknown strategy": "allreduse",
    "non-scalar loss": "the loss must be a scalar tensor, got shape (8, 1)",
    "three items": "must be an (inputs, target) pair, got 3 items",
    "pair without a loss": "an (inputs, target) batch needs a loss",
    "no loss in the output": "has no loss: pass loss_fn",
    "own loop on a pipeline": "call run.step(batch, loss_fn) instead",
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_bad_input_is_one_line(case: str) -> None:
    said = WORLDS.get("refusals")[0][case]
    assert EXPECTED[case] in said and "\n" not in said, said
