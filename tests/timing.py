"""A pytest plugin that sums test time per file: ``make test-times`` (``-p tests.timing``).

Each test's setup, call and teardown durations are added to its file's total (under
pytest-xdist the controller sees every worker's reports), and at the end the files are
printed slowest first, with their test counts, and written to ``test-times.txt``. Wall
time under ``-n N`` is about the sum over N, so the totals rank files, not the run.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

_seconds: Counter[str] = Counter()
_tests: Counter[str] = Counter()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _seconds[path] += report.duration
    if report.when == "call":
        _tests[path] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = [f"{s:8.1f} s {_tests[p]:5d} tests  {p}" for p, s in _seconds.most_common()]
    total = sum(_seconds.values())
    lines.append(f"{total:8.1f} s {sum(_tests.values()):5d} tests  (all files, summed)")
    Path("test-times.txt").write_text("\n".join(lines) + "\n")
    terminalreporter.write_sep("=", "seconds per test file (test-times.txt)")
    for line in lines[:25] + lines[-1:]:
        terminalreporter.write_line(line)
