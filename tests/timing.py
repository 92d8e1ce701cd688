"""A pytest plugin that sums test time per file: ``make test-times`` (``-p tests.timing``).

Each test's setup, call and teardown durations are added to its file's total (under
pytest-xdist the controller sees every worker's reports), and at the end the files are
printed costliest (CPU) first, with their test counts, and written to ``test-times.txt``. Wall
time under ``-n N`` is about the sum over N, so the totals rank files, not the run.

The CPU column is what the suite pays on a 2-core machine. Where cgroup v1's cpuacct
controller is writable (root on Linux), each test process moves itself into a cgroup of
its own at start, which every process it starts inherits (the fork server's ranks, the
zygote's forks, launchers and their workers), so a test's CPU is everything its tree
ran while it ran. Elsewhere it is the test process's own CPU plus that of the children it
waited for (the fork server's ranks are not its children: ``run_world`` tests show less
than they cost). The costliest tests are listed too (test-times.txt).
"""

from __future__ import annotations

import os
import resource
from collections import Counter
from collections.abc import Generator
from pathlib import Path

import pytest

_seconds: Counter[str] = Counter()
_cpu: Counter[str] = Counter()
_tests: Counter[str] = Counter()
_per_test: Counter[str] = Counter()
_last_cpu = 0.0  # this test process's CPU seconds (own + waited-for children) at the last report
_CPUACCT = Path("/sys/fs/cgroup/cpuacct")
_group: Path | None = None  # this test process's cgroup, once made


def pytest_configure(config: pytest.Config) -> None:
    """Move this process into a cpuacct cgroup of its own, where that can be done."""
    global _group
    group = _CPUACCT / "disttrain-tests" / str(os.getpid())
    try:
        group.mkdir(parents=True, exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        return  # not root, or no cgroup v1: rusage below
    _group = group


def pytest_unconfigure(config: pytest.Config) -> None:
    """Back to the root group, and this one removed (an empty group is removable)."""
    if _group is not None:
        try:
            (_CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
            _group.rmdir()
        except OSError:
            pass  # a process of ours still in it: the folder stays until it ends


def _cpu_now() -> float:
    if _group is not None:
        return int((_group / "cpuacct.usage").read_text()) / 1e9  # ns, the whole tree
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None]:
    """Attach the CPU spent since the last phase's report (runs where the test runs)."""
    global _last_cpu
    outcome = yield
    now = _cpu_now()
    if call.when == "setup" and _last_cpu == 0.0:
        _last_cpu = now  # the first test: start-up is nobody's
    outcome.get_result().user_properties.append(("cpu_s", now - _last_cpu))
    _last_cpu = now


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _seconds[path] += report.duration
    _cpu[path] += dict(report.user_properties).get("cpu_s", 0.0)
    _per_test[report.nodeid] += dict(report.user_properties).get("cpu_s", 0.0)
    if report.when == "call":
        _tests[path] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    row = "{:8.1f} cpu-s {:8.1f} s {:5d} tests  {}"
    lines = [row.format(c, _seconds[p], _tests[p], p) for p, c in _cpu.most_common()]
    total, cpu, tests = sum(_seconds.values()), sum(_cpu.values()), sum(_tests.values())
    lines.append(row.format(cpu, total, tests, "(all files, summed)"))
    costliest = [f"{c:8.1f} cpu-s  {t}" for t, c in _per_test.most_common(150)]
    Path("test-times.txt").write_text("\n".join([*lines, "", *costliest]) + "\n")
    terminalreporter.write_sep("=", "seconds per test file (test-times.txt)")
    for line in lines[:25] + lines[-1:]:
        terminalreporter.write_line(line)
