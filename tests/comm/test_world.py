"""The default process group can be freed after training (comm/world.py's early import).

``torch.distributed.nn.functional`` binds ``group.WORLD`` as a default argument when it
is imported, and the first optimizer imports it (through torch._dynamo). Imported after
a group formed, it pins that group: ``destroy_process_group()`` then leaves gloo's worker
threads alive into the interpreter's teardown, where one died in std::terminate at the
end of scripts that call ``disttrain.train`` in their own group. Checked in a fresh
process (the test process has imported torch's modules long ago): with ``disttrain``
imported first, the gloo threads are gone after ``destroy_process_group()``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import os, sys, tempfile
{first}
import torch
import torch.distributed as dist

def threads():
    return len(os.listdir("/proc/self/task"))

alone = threads()
store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)  # imports torch._dynamo
t = torch.ones(3)
dist.all_reduce(t)
dist.destroy_process_group()
print(alone, threads())
"""


def _threads(first: str) -> tuple[int, int]:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(first=first)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    alone, after = proc.stdout.split()
    return int(alone), int(after)


@pytest.mark.timeout(240)
def test_destroying_the_group_ends_gloos_threads_when_disttrain_was_imported_first() -> None:
    alone, after = _threads("import disttrain")
    assert after == alone, f"{after - alone} gloo threads outlive destroy_process_group()"
    # the reference: without the early import the group is pinned and its threads stay,
    # which is what this test guards against (if torch stops pinning it, this may go)
    alone, after = _threads("")
    assert after > alone


def test_shutdown_hooks_run_once_each_before_the_group_goes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from disttrain.comm import world

    monkeypatch.setattr(world, "_shutdown_hooks", [])
    seen: list[bool] = []

    def hook() -> None:  # the group must still exist when a hook drops its sub-groups
        import torch.distributed as dist

        seen.append(dist.is_initialized())

    world.at_shutdown(hook)
    world.at_shutdown(hook)  # registered once
    world.init()
    world.shutdown()
    assert seen == [True]


def test_a_single_process_s_store_files_go_at_shutdown_and_at_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from disttrain.comm import world

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    world.init()
    assert sorted(p.name for p in tmp_path.iterdir())  # the reserved name and its store
    world.shutdown()
    assert not list(tmp_path.iterdir()), "a plain process's store files outlive it"
    # a script that never calls shutdown: the files go when it exits
    code = "from disttrain.comm import world; world.init(); print(world.job_store_path())"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.startswith(str(tmp_path))
    assert not list(tmp_path.iterdir())
