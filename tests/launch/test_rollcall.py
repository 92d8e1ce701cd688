"""The roll call: who answered, who did not, per restart round."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from disttrain.launch import rollcall


def test_answers_are_read_back_and_the_silent_ones_returned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(rollcall.ENV, str(tmp_path))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert rollcall.answer(2, 3, timeout=0.0, named=5) == [0, 1]  # waited 1 s, nobody else came
    start = time.monotonic()
    rollcall.answer(1, 3, timeout=0.0)
    assert rollcall.answer(0, 3, timeout=30.0) == []  # all three answered: no wait at all
    assert time.monotonic() - start < 5
    assert rollcall.read(str(tmp_path)) == {0: None, 1: None, 2: 5}
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # a new round starts empty
    rollcall.answer(0, 1, timeout=0.0)
    assert rollcall.read(str(tmp_path)) == {0: None}


def test_without_a_folder_nothing_is_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(rollcall.ENV, raising=False)
    assert rollcall.answer(0, 4, timeout=5.0) == []
