"""Nested phases: each second is booked to the innermost phase, once, on the timed thread only."""

from __future__ import annotations

import threading
import time

import pytest

from disttrain.comm import phases


def test_a_nested_phase_takes_its_seconds_out_of_the_outer_one() -> None:
    ledger: dict[str, float] = {}
    start = time.perf_counter()
    with phases.book("compute", ledger):
        time.sleep(0.02)
        with phases.book("communication"):  # no ledger: the open phase's
            time.sleep(0.05)
            with phases.book("codec"):
                time.sleep(0.03)
    wall = time.perf_counter() - start
    assert ledger["codec"] >= 0.03 and ledger["communication"] >= 0.05
    # without the nested seconds taken out, compute would hold all 0.10 s
    assert 0.02 <= ledger["compute"] < 0.07
    assert sum(ledger.values()) == pytest.approx(wall, abs=1e-3)  # every second once


def test_a_phase_without_an_open_ledger_on_its_thread_books_nothing() -> None:
    ledger: dict[str, float] = {}

    def other_thread() -> None:  # e.g. the reducer's communication thread
        with phases.book("communication"):
            time.sleep(0.01)

    with phases.book("compute", ledger):
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
    assert set(ledger) == {"compute"}
    with phases.book("communication"):  # nothing open on this thread any more
        pass
    assert set(ledger) == {"compute"}
