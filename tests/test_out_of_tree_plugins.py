"""Adding a strategy or an algorithm edits no test (issue 37): out-of-tree ones, modules in
tmp_path named in ``$DISTTRAIN_PLUGINS``, are picked up by the registration, defaults-train
and fault-matrix tests by themselves. The suite's own files run in a child pytest with the
variable set; the plug-ins' rows must be there and pass."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: A strategy of its own (not a renamed built-in): every gradient averaged by torch's
#: allreduce after backward, one call per tensor, no buckets and no overlap.
PLUGIN = '''
import torch
import torch.distributed as dist

from disttrain.strategies import Strategy, register


@register
class EachGradient(Strategy):
    """Average each gradient with its own allreduce, after backward."""

    name = "each_gradient"

    def setup(self, model, optimizer):
        super().setup(model, optimizer)
        for tensor in model.state_dict().values():  # replicas start equal
            dist.broadcast(tensor, 0)

    def after_backward(self):
        for p in self.model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= self.world.world_size
'''
#: An algorithm of its own: every rank sends its whole tensor to every other and adds all
#: n tensors in rank order (so every rank ends with the same bytes).
ALGORITHM = '''
import torch

from disttrain.collectives.base import AlgorithmKind, AllReduceAlgorithm, Cost, register
from disttrain.comm.p2p import group_rank, group_size, post


class AllPairs(AllReduceAlgorithm):
    """Everyone sends everything to everyone; each adds the n tensors in rank order."""

    name = "all_pairs"

    def reduce_flat(self, flat, group):
        n, me = group_size(group), group_rank(group)
        parts = [flat.clone() if r == me else torch.empty_like(flat) for r in range(n)]
        others = [r for r in range(n) if r != me]
        post([(parts[me], r) for r in others], [(parts[r], r) for r in others], group)
        flat.copy_(parts[0])
        for part in parts[1:]:
            flat.add_(part)

    def cost(self, nbytes, world_size, rank=0, itemsize=1, op="all_reduce"):
        if world_size == 1 or nbytes == 0:
            return Cost(0, 0)
        return Cost((world_size - 1) * nbytes, world_size - 1)


register(AlgorithmKind(AllPairs))
'''
#: the suite's tests, as they are, narrowed to the plug-in's rows (one fault kind: each
#: kind's detection is the launcher's, already covered for every built-in strategy)
TESTS = [
    "tests/strategies/test_kind.py",
    "tests/strategies/test_defaults_train.py::test_defaults_train_near_allreduce_in_a_few_epochs",
    "tests/train/test_faults.py::test_a_fault_ends_the_job_naming_the_rank_and_leaves_nothing",
    "tests/collectives/test_registration.py",
]


@pytest.mark.timeout(400)
def test_an_out_of_tree_strategy_and_algorithm_join_the_suites_lists(tmp_path: Path) -> None:
    (tmp_path / "dt_oot_strategy.py").write_text(PLUGIN)
    (tmp_path / "dt_oot_algorithm.py").write_text(ALGORITHM)
    env = {
        **os.environ,
        "DISTTRAIN_PLUGINS": "dt_oot_strategy,dt_oot_algorithm",
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(tmp_path)]),
    }
    only = ["-k", "each_gradient and not hang and not nan and not raise or all_pairs"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", *TESTS, *only],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=380,
    )
    passed = re.findall(r"^PASSED (\S+)", done.stdout, re.M)
    assert done.returncode == 0, done.stdout[-3000:]
    joined = "\n".join(passed)
    # registration: its four parts (the plain settings and cost parts), its capabilities
    assert "test_each_kind_has_its_four_parts[each_gradient]" in joined
    assert "test_capabilities_are_classes_not_flags[each_gradient]" in joined
    # its defaults train (3 epochs, near allreduce) and a killed rank ends its job cleanly
    assert "test_defaults_train_near_allreduce_in_a_few_epochs[each_gradient]" in joined
    assert "[each_gradient-kill]" in joined, joined
    # the algorithm: its kind's empty path, and its sum and sends in a 3-rank world
    assert "test_nothing_to_send_has_an_empty_path[all_pairs]" in joined
    assert "test_each_algorithm_sums_as_torch_and_sends_what_its_cost_says[all_pairs]" in joined
