"""A user's model factory (``--model module:function``): found in the current directory,
given the data's shape by the names its signature asks for, and checked by one forward
pass before any worker starts."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from torch import nn

from disttrain.comm.errors import UsageError
from disttrain.config import load
from disttrain.data import load_dataset
from disttrain.launch.preflight import preflight
from disttrain.models import build_model

FACTORIES = """
from torch import nn

def bare():
    return nn.Linear(64, 10)

def shaped(in_features, num_classes):
    return nn.Sequential(nn.Linear(in_features, 16), nn.ReLU(), nn.Linear(16, num_classes))

def language(vocab, seq_len, in_features):
    return nn.Sequential(nn.Embedding(vocab, 8), nn.Linear(8, vocab))

def wrong_input():
    return nn.Linear(63, 10)

def wrong_output():
    return nn.Linear(64, 7)
"""


@pytest.fixture()
def user_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder holding ``usermodels_t.py``, made the current directory (not on sys.path)."""
    (tmp_path / "usermodels_t.py").write_text(FACTORIES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "usermodels_t", raising=False)
    return tmp_path


def test_a_factory_in_the_current_directory_is_imported_and_given_the_shapes(
    user_folder: Path,
) -> None:
    digits = load_dataset("digits")
    assert isinstance(build_model("usermodels_t:bare", digits), nn.Linear)
    model = build_model("usermodels_t:shaped", digits)
    assert model[0].in_features == 64 and model[2].out_features == 10
    pycode = load_dataset(load({"dataset": "pycode", "pycode_chars": 20000}).data)
    lm = build_model("usermodels_t:language", pycode)
    assert lm[0].num_embeddings == 256 and lm[1].out_features == 256
    with pytest.raises(UsageError, match="asks for vocab, which only a language-model data"):
        build_model("usermodels_t:language", digits)


def test_a_path_to_a_python_file_is_loaded_from_that_file(
    user_folder: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    elsewhere = tmp_path_factory.mktemp("models") / "mine.py"  # not the current folder
    elsewhere.write_text(FACTORIES)
    digits = load_dataset("digits")
    for spec in (f"{elsewhere}:shaped", f"{os.path.relpath(elsewhere)}:shaped"):
        model = build_model(spec, digits)
        assert model[0].in_features == 64 and model[2].out_features == 10
    with pytest.raises(UsageError, match=r"no such file .*nope\.py$"):
        build_model(f"{elsewhere.parent / 'nope.py'}:shaped", digits)


def test_a_missing_module_names_the_file_it_looked_for(user_folder: Path) -> None:
    with pytest.raises(UsageError) as info:
        build_model("nosuchmodels_t:make", load_dataset("digits"))
    assert f"no {user_folder / 'nosuchmodels_t.py'} (run from the folder" in str(info.value)


@pytest.mark.parametrize(
    ("factory", "said"),
    [
        ("wrong_input", "a batch x (32, 64) failed in forward: RuntimeError: mat1 and mat2"),
        ("wrong_output", "gave output (32, 7), but the loss needs (batch, 10) logits"),
    ],
)
def test_preflight_runs_one_batch_and_names_a_shape_mistake_in_one_line(
    user_folder: Path, factory: str, said: str
) -> None:
    with pytest.raises(UsageError) as info:
        preflight(load({"model": f"usermodels_t:{factory}"}))
    text = str(info.value)
    assert text.startswith(f"--model usermodels_t:{factory} on --dataset digits: ") and said in text
    assert "\n" not in text
    preflight(load({"model": "usermodels_t:shaped"}))  # a right model passes


@pytest.mark.timeout(240)
def test_the_real_command_trains_a_factory_from_the_current_directory(user_folder: Path) -> None:
    """No PYTHONPATH=.: the launcher and every worker import it from where the user stands."""
    import subprocess

    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src}  # the package only, not the user's folder
    # the console script, whose sys.path[0] is its bin folder (python -m would add the cwd)
    script = Path(sys.executable).parent / "disttrain"
    if not script.exists():
        pytest.skip(f"no console script beside {sys.executable}")
    done = subprocess.run(
        [
            str(script),
            "train",
            "--model",
            "usermodels_t:shaped",
            "--max-steps",
            "2",
            "--epochs",
            "1",
            "--no-progress",
            "--out",
            "run",
        ],
        cwd=user_folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert done.returncode == 0, done.stderr
    assert (user_folder / "run" / "summary.json").exists()
