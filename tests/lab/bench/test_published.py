"""bench published: every row of the published table, read at run time, predicted."""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest
import tomllib

from disttrain.lab.bench import _published_data as data
from disttrain.lab.bench import published
from tests import zygote

TABLE = published.DEFAULT


def test_every_row_is_predicted_or_says_why_not() -> None:
    recs, fitted = published.evaluate(TABLE)
    with open(TABLE, "rb") as fh:
        ids = [r["id"] for r in tomllib.load(fh)["row"]]
    assert [r["id"] for r in recs] == ids  # every row, in the file's order
    for r in recs:
        assert r["why"], f"{r['id']}: no one-line explanation"
        if r["predicted"] is None:
            assert r["status"].startswith("not modelled: ")
        else:
            assert r["predicted"] > 0
    named = data.shared()
    assert set(fitted) == set(named.families) | set(named.intra_families)


def test_constants_are_fitted_on_calibration_rows_only() -> None:
    with open(TABLE, "rb") as fh:
        cal = {r["id"] for r in tomllib.load(fh)["row"] if r["calibration"]}
    named = data.shared()
    assert set(named.families.values()) <= cal
    assert set(named.intra_families.values()) <= cal
    recs, _ = published.evaluate(TABLE)
    for r in recs:  # each fitted family reproduces its own calibration row
        if r["id"] in named.families.values() or r["id"] in named.intra_families.values():
            assert r["error"] == pytest.approx(0.0, abs=1e-4)


def test_the_figures_come_from_the_file(tmp_path: Path) -> None:
    copy = tmp_path / "measurements.toml"
    text = TABLE.read_text().replace("figure = 0.68\n", "figure = 0.5\n", 1)
    copy.write_text(text)
    recs, _ = published.evaluate(copy)
    vgg = next(r for r in recs if r["id"] == "horovod-vgg16-512")
    assert vgg["published"] == 0.5


def test_the_held_out_block_reports_its_own_median(capsys: pytest.CaptureFixture[str]) -> None:
    published.run(argparse.Namespace(table=str(TABLE), calibration_only=False))
    out = capsys.readouterr().out
    recs, _ = published.evaluate(TABLE)
    held = [abs(r["error"]) for r in recs if not r["calibration"] and r["status"] == "scored"]
    assert f"median |error| {statistics.median(held):.1%}" in out
    assert "## calibration rows" in out and "## held-out rows" in out
    assert out.index("## calibration rows") < out.index("## held-out rows")


def test_it_runs_as_a_command(tmp_path: Path) -> None:
    shutil.copy(TABLE, tmp_path / "m.toml")
    cmd = [sys.executable, "-m", "disttrain", "bench", "published", "--calibration-only"]
    done = zygote.run(
        [*cmd, "--table", str(tmp_path / "m.toml")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "calibration rows: 11 rows scored" in done.stdout
    assert "held-out" not in done.stdout


INDEPENDENT = TABLE.parent / "independent.toml"
#: the second check's table (sources in neither list)
INDEPENDENT2 = TABLE.parent / "independent2.toml"
#: the third check's table (sources in none of the other three)
INDEPENDENT3 = TABLE.parent / "independent3.toml"


@pytest.mark.parametrize("table", [INDEPENDENT, INDEPENDENT2, INDEPENDENT3], ids=lambda p: p.stem)
def test_the_independent_table_has_every_row_predicted(table: Path) -> None:
    with open(table, "rb") as fh:
        rows = tomllib.load(fh)["row"]
    assert rows and not any(r["calibration"] for r in rows)
    recs, fitted = published.evaluate(table)
    assert [r["id"] for r in recs] == [r["id"] for r in rows]  # none silently dropped
    for r in recs:
        assert r["why"], f"{r['id']}: no one-line explanation"
        if r["predicted"] is None:
            assert r["status"].startswith("not modelled: ")
        else:
            assert r["predicted"] > 0 and r["status"] == "scored"
    # the rates are the ones fitted on measurements.toml's calibration rows, unchanged
    with open(TABLE, "rb") as fh:
        reference = {r["id"]: r for r in tomllib.load(fh)["row"]}
    assert fitted == published.fit_families(reference)


def test_the_independent_check_prints_its_own_block(capsys: pytest.CaptureFixture[str]) -> None:
    published.run(argparse.Namespace(table=str(INDEPENDENT), calibration_only=False))
    out = capsys.readouterr().out
    assert out.startswith("independent check: ")
    assert "## independent rows" in out and "independent rows: " in out
    assert "## calibration rows" not in out and "## held-out rows" not in out


def test_an_independent_table_reusing_a_calibrated_rows_id_is_refused(tmp_path: Path) -> None:
    # its rows would be predicted with measurements.toml's assumptions for that id
    from disttrain.comm.errors import UsageError

    copy = tmp_path / "independent.toml"
    text = TABLE.read_text().replace("calibration = true", "calibration = false")
    copy.write_text(text)
    with pytest.raises(UsageError, match=r"is a measurements\.toml row.s id"):
        published.evaluate(copy)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (None, "No such file or directory"),
        ("x = = 1\n", "not TOML"),
        ("a = 1\n", "no [[row]] entries"),
        ('[[row]]\nid = "r"\n', "row 1 has no calibration, source, unit, figure"),
    ],
    ids=["missing", "not-toml", "no-rows", "row-keys"],
)
def test_a_table_that_cannot_be_read_is_one_line(
    text: str | None, says: str, tmp_path: Path
) -> None:
    from disttrain.comm.errors import UsageError

    path = tmp_path / "t.toml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(UsageError, match=re.escape(says)):
        published.evaluate(path)


def test_a_scale_out_pair_is_the_ratio_of_the_two_rows() -> None:
    recs, _ = published.evaluate(INDEPENDENT2)
    by_id = {r["id"]: r for r in recs}
    pairs = published.scale_outs(recs)
    named = [r["id"] for r in recs if r["scales_with"]]
    assert [p["id"] for p in pairs] == named and named  # every named pair, none invented
    for p in pairs:
        big, small = by_id[p["id"]], by_id[p["from"]]
        assert p["gpus"] == (small["gpus"], big["gpus"]) and small["gpus"] < big["gpus"]
        assert p["published"] == pytest.approx(big["published"] / small["published"])
        assert p["predicted"] == pytest.approx(big["predicted"] / small["predicted"])
        assert p["error"] == pytest.approx(p["predicted"] / p["published"] - 1)
        ideal = big["gpus"] / small["gpus"]  # the baseline: perfect scaling
        assert p["linear_error"] == pytest.approx(ideal / p["published"] - 1)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"scales_with": "no-such-row"}, "scales_with 'no-such-row' names no row of the table"),
        ({"scales_with": ""}, "scales_with '' names no row of the table"),
        ({"scales_with": "itself"}, "needs fewer GPUs than the row's"),
        ({"unit": "tflops_per_gpu"}, "needs both rows in one unit of a job's total"),
        ({"model": "gpt 80 8192"}, "names another source's or model's run (gpt 32 4096, "),
        ({"predicted": None}, "names a row pair the model does not predict"),
    ],
    ids=["missing", "empty", "itself", "other-unit", "other-model", "not-modelled"],
)
def test_a_scale_out_pair_that_is_no_scale_out_is_refused(
    change: dict[str, Any], says: str
) -> None:
    from disttrain.comm.errors import UsageError

    recs, _ = published.evaluate(INDEPENDENT2)
    broken = [dict(r) for r in recs]
    row = next(r for r in broken if r["scales_with"])
    row.update(change)
    if row["scales_with"] == "itself":
        row["scales_with"] = row["id"]
    with pytest.raises(UsageError) as err:
        published.scale_outs(broken, "t.toml")
    assert str(err.value).startswith(f"--table t.toml: {row['id']}: ")
    assert says in str(err.value)


def test_a_scale_out_pair_in_a_per_gpu_unit_is_refused() -> None:
    # perfect scaling keeps a per-GPU figure, so the GPU counts' ratio is no baseline for it
    from disttrain.comm.errors import UsageError

    recs, _ = published.evaluate(INDEPENDENT2)
    broken = [dict(r) for r in recs]
    row = next(r for r in broken if r["scales_with"])
    for r in broken:
        if r["id"] in (row["id"], row["scales_with"]):
            r["unit"] = "tflops_per_gpu"
    with pytest.raises(UsageError, match="needs both rows in one unit of a job's total"):
        published.scale_outs(broken)


def test_the_scale_out_block_is_printed_with_its_median(
    capsys: pytest.CaptureFixture[str],
) -> None:
    published.run(argparse.Namespace(table=str(INDEPENDENT2), calibration_only=False))
    out = capsys.readouterr().out
    errs = [abs(p["error"]) for p in published.scale_outs(published.evaluate(INDEPENDENT2)[0])]
    assert "## scale-out pairs" in out
    assert f"scale-out pairs: {len(errs)}, median |error| {statistics.median(errs):.1%}" in out
    assert f"perfect scaling: {len(errs)}, median |error| " in out
