"""Adding a strategy edits no test (issue 37): an out-of-tree one, a module in tmp_path named
in ``$DISTTRAIN_PLUGINS``, is picked up by the registration, defaults-train and fault-matrix
tests by themselves. The suite's own files run in a child pytest with the variable set; the
plug-in's rows must be there and pass."""

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
#: the suite's tests, as they are, narrowed to the plug-in's rows (one fault kind: each
#: kind's detection is the launcher's, already covered for every built-in strategy)
TESTS = [
    "tests/strategies/test_kind.py",
    "tests/strategies/test_defaults_train.py::test_defaults_train_near_allreduce_in_a_few_epochs",
    "tests/train/test_faults.py::test_a_fault_ends_the_job_naming_the_rank_and_leaves_nothing",
]


@pytest.mark.timeout(400)
def test_an_out_of_tree_strategy_joins_the_suites_lists(tmp_path: Path) -> None:
    (tmp_path / "dt_oot_strategy.py").write_text(PLUGIN)
    env = {
        **os.environ,
        "DISTTRAIN_PLUGINS": "dt_oot_strategy",
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(tmp_path)]),
    }
    only = ["-k", "each_gradient and not hang and not nan and not raise"]
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
