"""The cost-model validation report: fitted rows never score the model; signs show a bias."""

from __future__ import annotations

from typing import Any

from disttrain.lab.bench.costmodel_validation import report


def _row(kind: str, config: str, measured: float, predicted: float, held: bool) -> dict[str, Any]:
    return {
        "kind": kind,
        "config": config,
        "measured_s": measured,
        "predicted_s": predicted,
        "error": abs(predicted - measured) / measured,
        "held_out": held,
    }


def test_fitted_rows_are_reported_apart_and_do_not_lower_the_held_out_median(capsys) -> None:
    rows = [
        _row("allreduce", "n=2 ring 4KB", 1.0, 1.0, held=False),  # exact: it was fitted
        _row("allreduce", "n=2 ring 4KB", 1.0, 1.0, held=False),
        _row("allreduce", "n=2 tree 64KB", 1.0, 1.2, held=True),
        _row("allreduce", "n=3 tree 64KB", 1.0, 0.7, held=True),
        _row("dp", "n=2 mlp", 1.0, 0.8, held=True),
        _row("dp", "n=3 mlp", 1.0, 0.9, held=True),
    ]
    out = report(rows)
    text = capsys.readouterr().out
    assert text.index("Fitted") < text.index("Held out")
    # held out: errors 0.2, 0.3, 0.2, 0.1 -> median 0.2 (all rows would give 0.15)
    assert out["held out"] == "20.0% (4 rows)"
    assert out["fitted"] == "0.0% (2 rows); 0 over, 2 under"
    assert out["held out dp"].endswith("0 over, 2 under")  # a bias: every row one sign
    assert out["held out allreduce"].endswith("1 over, 1 under")
    assert out["held out allreduce tree"] == "25.0% (2 rows); 1 over, 1 under"
    assert "| dp | n=2 mlp | 1e+03 | 800 | -20% |" in text
