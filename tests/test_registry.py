"""The one registry type: its usage error, plug-ins loaded on first lookup, a bad plug-in."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from disttrain import registry
from disttrain.comm.errors import UsageError
from tests import zygote


def test_unknown_name_is_a_usage_error_listing_the_choices() -> None:
    reg: registry.Registry[int] = registry.Registry("widget", flag="--widget")
    reg.add("a", 1)
    reg.add("b", 2)
    assert reg.get("b") == 2 and "a" in reg and list(reg) == ["a", "b"] and len(reg) == 2
    with pytest.raises(UsageError, match=r"^--widget 'c': unknown widget; choose one of a, b$"):
        reg.get("c")
    reg.remove("a")
    assert reg.names() == ["b"]


def test_plugins_register_when_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dt_reg_plugin.py").write_text(
        "from tests.test_registry import SHARED\nSHARED.add('from-plugin', 7)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(registry.PLUGINS_ENV, "dt_reg_plugin")
    assert "from-plugin" not in SHARED
    registry.load_plugins()
    assert SHARED.get("from-plugin") == 7
    SHARED.remove("from-plugin")


SHARED: registry.Registry[int] = registry.Registry("thing")


def test_a_bad_plugin_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {**os.environ, registry.PLUGINS_ENV: "no_such_module_dt"}
    proc = zygote.run(
        [sys.executable, "-m", "disttrain", "train", "--workers", "1", "--max-steps", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "DISTTRAIN_PLUGINS: cannot import no_such_module_dt" in lines[0]
