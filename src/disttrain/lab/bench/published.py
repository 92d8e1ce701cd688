"""Published: the scenario model's predictions against 48 published measurements.

    disttrain bench published
    disttrain bench published --calibration-only     # the rows constants may be fitted on
    disttrain bench published --table benchmarks/published/independent.toml  # the check

Reads benchmarks/published/measurements.toml at run time. Each row becomes a scenario
(what the row states, plus the assumptions beside it in the table, ``[row.assume]``, each
with its reason, read by :mod:`disttrain.lab.bench._published_data`), is predicted by
:mod:`disttrain.lab.scenario`, and is compared in the row's own unit. Calibration rows
are reported apart from the held-out rows; the held-out median and worst error are the
issue's measure (issue 38: median <= 12 %, no row > 35 %). The GPU rates no source
publishes are fitted here, each on its one calibration row, and printed. A table with no
calibration row (independent.toml, the independent check) is predicted with the rates
fitted on measurements.toml's calibration rows, unchanged (independent2.toml and
independent3.toml are two more such checks). Rows naming ``scales_with`` are also scored
as scale-out pairs, beside perfect scaling; the pairs whose larger run spans more than one
node (the network's part of the model) are summed up apart from those inside one node.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
from pathlib import Path
from typing import Any

import tomllib

from disttrain.comm.errors import UsageError
from disttrain.lab.bench import _published_data as data
from disttrain.lab.scenario import parse, predict
from disttrain.lab.scenario.hardware import INTRA_PRESETS
from disttrain.lab.scenario.reader import scaled

__all__ = ["add_arguments", "evaluate", "run", "scale_outs"]

DEFAULT = Path(__file__).resolve().parents[4] / "benchmarks" / "published" / "measurements.toml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--table", default=str(DEFAULT), help="the measurements file")
    parser.add_argument("--calibration-only", action="store_true", help="only the calibration rows")


def _precision(text: str, transformer: bool) -> str:
    t = text.lower()
    for start, name in (("fp32", "fp32"), ("tf32", "fp32"), ("amp", "amp"), ("mixed", "amp")):
        if t.startswith(start):
            return name
    if t.startswith(("fp16", "half")):
        return "fp16"
    if t.startswith(("bf16", "fp8")):  # fp8 GEMMs, half-precision gradients
        return "bf16"
    return "bf16" if transformer else "fp32"  # not stated: the era's default


def _model(row: dict[str, Any], ov: dict[str, Any]) -> dict[str, Any]:
    given = ov.get("model", {})
    name = given.get("name", row["model"])
    out: dict[str, Any] = {"name": name}
    if name == "gpt":
        for key in ("layers", "hidden", "heads", "seq_len", "vocab"):
            if key in given or key in row:
                out[key] = given.get(key, row.get(key))
        out.setdefault("heads", out["hidden"] // 128)
    elif name.startswith("bert"):
        out["seq_len"] = given.get("seq_len", row.get("seq_len", 128))
    out["activation_checkpointing"] = bool(
        ov.get("ckpt", row.get("activation_checkpointing", False))
    )
    return out


def _hardware(row: dict[str, Any], ov: dict[str, Any], rate: dict[str, float]) -> dict[str, Any]:
    hw: dict[str, Any] = {"gpus_per_node": ov.get("gpus_per_node", row.get("gpus_per_node", 8))}
    hw.update(rate)
    suggested = str(row.get("suggested_intra_node", "")).split(" ")[0]
    hw["intra_node"] = ov.get("intra", suggested if suggested in INTRA_PRESETS else "pcie3")
    if "hw" in ov:
        hw.update(ov["hw"])
    elif row["gpus"] > hw["gpus_per_node"]:
        hw["inter_bandwidth"] = str(row["suggested_inter_bandwidth"]).split(" ")[0]
        hw["inter_fabric"] = str(row["suggested_inter_fabric"]).split(" ")[0]
        hw["nics_per_node"] = int(row.get("suggested_nics_per_node", 1))
    return hw


def _rate(
    row: dict[str, Any], ov: dict[str, Any], by_id: dict[str, Any], fitted: dict[str, float]
) -> dict[str, float]:
    """The one-GPU rate: stated, borrowed from another row, or a family's fitted TFLOP/s."""
    if "rate" in ov:
        return {"gpu_samples_per_second": ov["rate"]}
    if ov.get("rate_tflops_from") == "baseline":
        return {"gpu_tflops": row["baseline_figure"]}
    if "family" in ov:
        return {"gpu_tflops": _moved(ov["family"], row, ov, by_id, fitted)}
    src = row if ov.get("rate_from", "one_gpu") == "one_gpu" else by_id[ov["rate_from"]]
    if "one_gpu_figure" in src:
        return {"gpu_samples_per_second": src["one_gpu_figure"]}
    if src.get("baseline_gpus") == 1:
        return {"gpu_samples_per_second": src["baseline_figure"]}
    raise ValueError("no one-GPU rate")


def _hidden(row: dict[str, Any]) -> int:
    ov = data.assume(row)
    return int(ov.get("model", {}).get("hidden", row.get("hidden", 0)))


def _moved(
    family: str,
    row: dict[str, Any],
    ov: dict[str, Any],
    by_id: dict[str, Any],
    fitted: dict[str, float],
) -> float:
    """The family's fitted rate moved from its calibration row's hidden size to this row's
    by the roofline of the family's ``memory_bandwidth`` (shared.toml)."""
    named = data.shared()
    tflops = fitted[family]
    k = 68 * tflops * 1e12 / (24 * named.memory_bandwidth[family])
    h, h_cal = _hidden(row), _hidden(by_id[named.families[family]])
    return tflops * (1 + k / h_cal) / (1 + k / h)


def scenario(
    row: dict[str, Any], by_id: dict[str, Any], fitted: dict[str, float]
) -> dict[str, Any]:
    """The row as a scenario file's tables."""
    ov = data.assume(row)
    model = _model(row, ov)
    run: dict[str, Any] = {"gpus": row["gpus"]}
    for key in ("batch_per_gpu", "global_batch", "accumulation"):
        if key in row:
            run[key] = row[key]
    run["strategy"] = str(row["strategy"]).split(" ")[0]
    run["precision"] = _precision(
        str(row["precision"]), model["name"] in ("gpt", "bert-base", "bert-large")
    )
    run.update(ov.get("run", {}))
    if "bucket_mb" in ov:
        run["bucket_mb"] = ov["bucket_mb"]
    hw = _hardware(row, ov, _rate(row, ov, by_id, fitted))
    if "intra_family" in ov:
        del hw["intra_node"]
        hw["intra_bandwidth"] = f"{fitted[ov['intra_family']] / 1e9:.6g}GB/s"
    return {"model": model, "hardware": hw, "run": run}


def _baseline(row: dict[str, Any], sc: dict[str, Any]) -> dict[str, Any]:
    """The same scenario at the row's baseline GPU count (strong or weak scaling)."""
    base = copy.deepcopy(sc)
    r = base["run"]
    n = int(row["baseline_gpus"])
    r["gpus"] = n
    given = data.assume(row).get("base", {})
    if "strategy" in given:
        r["strategy"] = given["strategy"]
    else:  # a stated data-parallel part scaled to the baseline's GPUs
        r["strategy"] = scaled(r["strategy"], n)
    if data.strong(row):
        r.pop("accumulation", None)
    else:
        r.pop("global_batch", None)
    return base


def predicted(row: dict[str, Any], sc: dict[str, Any]) -> float:
    """The prediction in the row's unit."""
    p = predict(parse(sc, row["id"]))
    unit = row["unit"]
    if unit in ("images_per_second", "sequences_per_second"):
        return p.samples_per_second
    if unit == "tokens_per_second":
        return p.samples_per_second * sc["model"]["seq_len"]
    if unit == "tflops_per_gpu":
        return float(p.breakdown["model_tflops_per_gpu"])
    if row.get("baseline_gpus", 1) in (None, 1) and unit == "scaling_efficiency":
        return p.scaling_efficiency
    b = predict(parse(_baseline(row, sc), row["id"]))
    if unit == "scaling_efficiency":
        return p.scaling_efficiency / b.scaling_efficiency
    if unit == "mfu":
        return (
            row["baseline_figure"]
            * p.breakdown["model_tflops_per_gpu"]
            / b.breakdown["model_tflops_per_gpu"]
        )
    if unit == "time_to_train_minutes":  # the same samples at the two rates
        return row["baseline_figure"] * b.samples_per_second / p.samples_per_second
    raise ValueError(f"unit {unit!r} not compared")


def fit_families(by_id: dict[str, Any]) -> dict[str, float]:
    """Each family's gpu_tflops (or intra-node bytes/s), by bisection in log until its
    calibration row is hit; the prediction rises with either."""
    fitted: dict[str, float] = {}
    named = data.shared()
    families = [(f, r, 1.0, 1e4) for f, r in named.families.items()]
    families += [(f, r, 1e8, 1e12) for f, r in named.intra_families.items()]
    for family, row_id, low, high in families:
        row = by_id[row_id]
        assert row["calibration"], f"{row_id} must be a calibration row"
        lo, hi = math.log(low), math.log(high)
        for _ in range(60):
            mid = (lo + hi) / 2
            fitted[family] = math.exp(mid)
            if predicted(row, scenario(row, by_id, fitted)) < row["figure"]:
                lo = mid
            else:
                hi = mid
        fitted[family] = math.exp((lo + hi) / 2)
    return fitted


#: what every row must state (benchmarks/published/README.md, the row format)
REQUIRED = ("id", "calibration", "source", "unit", "figure")


def _rows(path: str | Path) -> list[dict[str, Any]]:
    """The table's ``[[row]]`` entries; a file that cannot be one is one line (exit 2)."""
    try:
        with open(path, "rb") as fh:
            rows = tomllib.load(fh).get("row")
    except OSError as exc:
        raise UsageError(f"--table {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"--table {path}: not TOML ({exc})") from None
    if not isinstance(rows, list) or not rows:
        raise UsageError(f"--table {path}: no [[row]] entries")
    for k, row in enumerate(rows, 1):
        missing = [key for key in REQUIRED if key not in row]
        if missing:
            raise UsageError(f"--table {path}: row {k} has no {', '.join(missing)}")
    return list(rows)


def evaluate(path: str | Path = DEFAULT) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Every row: id, calibration, unit, published, predicted (None: not modelled), error,
    status (scored, apart, not modelled) and the explanation. A table without calibration
    rows (the independent check) takes its fitted rates from measurements.toml's."""
    table = _rows(path)
    by_id = {r["id"]: r for r in table}
    if any(r["calibration"] for r in table):
        fitted = fit_families(by_id)
    else:
        reference = {r["id"]: r for r in _rows(DEFAULT)}
        reused = sorted(set(reference) & set(by_id))
        if reused:  # their assumptions would be the measurements.toml row's
            raise UsageError(f"--table {path}: {reused[0]} is a measurements.toml row's id")
        fitted = fit_families(reference)
        by_id = {**reference, **by_id}
    out = []
    for row in table:
        rec: dict[str, Any] = {
            "id": row["id"],
            "source": row["source"],
            "calibration": bool(row["calibration"]),
            "unit": row["unit"],
            "published": float(row["figure"]),
            "predicted": None,
            "error": None,
            "status": "scored",
            "why": data.why(row),
            "gpus": int(row["gpus"]),
            "gpus_per_node": int(
                data.assume(row).get("gpus_per_node", row.get("gpus_per_node", 8))
            ),
            "scales_with": row.get("scales_with"),
            # the model and, for gpt, its shape: a pair is one model at two scales
            "model": " ".join(str(row[k]) for k in ("model", "layers", "hidden") if k in row),
        }
        reason = data.not_modelled(row)
        if reason is not None:
            rec["status"] = "not modelled: " + reason
        else:
            value = predicted(row, scenario(row, by_id, fitted))
            rec["predicted"] = value
            rec["error"] = value / row["figure"] - 1
            apart = data.apart(row)
            if apart is not None:
                rec["status"] = "apart: " + apart
        out.append(rec)
    return out, fitted


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _block(title: str, recs: list[dict[str, Any]]) -> None:
    print(f"\n## {title}\n")
    print("| row | unit | published | predicted | error | what the model leaves out |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for r in recs:
        pred = "-" if r["predicted"] is None else _fmt(r["predicted"])
        err = "-" if r["error"] is None else f"{r['error']:+.1%}"
        why = r["why"] if r["status"].startswith("scored") else r["status"]
        if r["status"].startswith("apart"):
            why = f"{r['status']}; {r['why']}"
        print(f"| {r['id']} | {r['unit']} | {_fmt(r['published'])} | {pred} | {err} | {why} |")
    errs = [abs(r["error"]) for r in recs if r["status"] == "scored"]
    if errs:
        worst = max((r for r in recs if r["status"] == "scored"), key=lambda r: abs(r["error"]))
        print(
            f"\n{title}: {len(errs)} rows scored, median |error| {statistics.median(errs):.1%}, "
            f"worst {abs(worst['error']):.1%} ({worst['id']})"
        )


def _by_source(recs: list[dict[str, Any]]) -> None:
    for source in dict.fromkeys(r["source"] for r in recs):
        errs = [abs(r["error"]) for r in recs if r["source"] == source and r["status"] == "scored"]
        if errs:
            print(
                f"  {source}: {len(errs)} rows, median |error| {statistics.median(errs):.1%}, "
                f"worst {max(errs):.1%}"
            )


#: units of a whole job's throughput, whose ratio at two GPU counts is the scale-out
_TOTALS = ("images_per_second", "sequences_per_second", "tokens_per_second")


def _not_a_pair(r: dict[str, Any], base: dict[str, Any] | None) -> str:
    """Why ``r`` and the row it names are no scale-out pair; empty when they are one."""
    if base is None:
        return "names no row of the table"
    if r["predicted"] is None or base["predicted"] is None:
        return "names a row pair the model does not predict"
    if (base["source"], base["model"]) != (r["source"], r["model"]):
        return f"names another source's or model's run ({base['model']}, {base['source']})"
    if base["unit"] != r["unit"] or r["unit"] not in _TOTALS:
        return (
            f"needs both rows in one unit of a job's total ({', '.join(_TOTALS)}); they are "
            f"{r['unit']} and {base['unit']}"
        )
    if base["gpus"] >= r["gpus"]:  # perfect scaling is n1/n0 > 1
        return f"needs fewer GPUs than the row's {r['gpus']}; {base['id']} has {base['gpus']}"
    return ""


def scale_outs(recs: list[dict[str, Any]], table: str | Path = "") -> list[dict[str, Any]]:
    """Each row that names ``scales_with`` (the same run at fewer GPUs, same unit) against
    that row: the published and predicted ratios of the two figures. The one-GPU rate
    cancels from the predicted ratio, so this scores what distribution adds alone. Beside
    it, the ratio of perfect scaling (the GPU counts'), the baseline a model must beat.
    A row naming something that is no such pair is refused (UsageError, one line)."""
    by_id = {r["id"]: r for r in recs}
    out = []
    for r in recs:
        if r["scales_with"] is None:
            continue
        base = by_id.get(str(r["scales_with"]))
        problem = _not_a_pair(r, base)
        if problem or base is None:
            raise UsageError(
                f"--table {table}: {r['id']}: scales_with {r['scales_with']!r} {problem}"
            )
        published_ = r["published"] / base["published"]
        predicted_ = r["predicted"] / base["predicted"]
        per_node = max(1, r["gpus_per_node"])
        out.append(
            {
                "id": r["id"],
                "from": base["id"],
                "gpus": (base["gpus"], r["gpus"]),
                # nodes of the two runs; the pair crosses nodes when its larger run does
                "nodes": (math.ceil(base["gpus"] / per_node), math.ceil(r["gpus"] / per_node)),
                "published": published_,
                "predicted": predicted_,
                "error": predicted_ / published_ - 1,
                "linear_error": r["gpus"] / base["gpus"] / published_ - 1,
            }
        )
    return out


def _pair_summary(label: str, pairs: list[dict[str, Any]]) -> None:
    for name, key in (("model", "error"), ("perfect scaling", "linear_error")):
        errs = [abs(p[key]) for p in pairs]
        print(
            f"{label} {name}: {len(errs)}, median |error| {statistics.median(errs):.1%}, "
            f"worst {max(errs):.1%}"
        )


def _scale_out_block(pairs: list[dict[str, Any]]) -> None:
    if not pairs:
        return
    print("\n## scale-out pairs (the same run at two GPU counts; the one-GPU rate cancels)\n")
    head = "| row | from | GPUs | nodes | published ratio | predicted ratio | error |"
    print(head + " perfect scaling |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: |")
    for p in pairs:
        n0, n1 = p["gpus"]
        k0, k1 = p["nodes"]
        print(
            f"| {p['id']} | {p['from']} | {n0} -> {n1} | {k0} -> {k1} | {p['published']:.3f} | "
            f"{p['predicted']:.3f} | {p['error']:+.1%} | {p['linear_error']:+.1%} |"
        )
    for label, key in (("scale-out pairs", "error"), ("perfect scaling", "linear_error")):
        errs = [abs(p[key]) for p in pairs]
        print(
            f"\n{label}: {len(errs)}, median |error| {statistics.median(errs):.1%}, "
            f"worst {max(errs):.1%}",
            end="",
        )
    print("\n")
    across = [p for p in pairs if p["nodes"][1] > 1]
    inside = [p for p in pairs if p["nodes"][1] == 1]
    for label, group in (("across nodes", across), ("inside one node", inside)):
        if group:
            _pair_summary(label, group)
    if across:
        med = [statistics.median(abs(p[k]) for p in across) for k in ("error", "linear_error")]
        wins = sum(abs(p["error"]) < abs(p["linear_error"]) for p in across)
        verdict = "beats" if med[0] < med[1] else "does not beat"
        print(
            f"across nodes: the model {verdict} perfect scaling by the median "
            f"({med[0]:.1%} against {med[1]:.1%}); closer on {wins} of {len(across)} pairs"
        )


def run(args: argparse.Namespace) -> int:
    recs, fitted = evaluate(args.table)
    pairs = scale_outs(
        recs, args.table
    )  # a pair that is none is refused before anything is printed
    independent = not any(r["calibration"] for r in recs)
    if independent:
        print(
            f"independent check: {args.table}, {len(recs)} rows, none of them used to choose "
            "any constant or assumption; the rates below are fitted on measurements.toml's "
            "calibration rows\n"
        )
    print("fitted one-GPU rates (each on its calibration row):")
    named = data.shared()
    for family, tflops in fitted.items():
        if family in named.intra_families:
            on = named.intra_families[family]
            print(f"  {family}: {tflops / 1e9:.2f} GB/s intra-node (on {on})")
        else:
            print(f"  {family}: {tflops:.1f} TFLOP/s (on {named.families[family]})")
    if independent:
        _block("independent rows", recs)
        _by_source(recs)
        _scale_out_block(pairs)
        return 0
    _block("calibration rows", [r for r in recs if r["calibration"]])
    if not args.calibration_only:
        _block("held-out rows", [r for r in recs if not r["calibration"]])
        _scale_out_block(pairs)
    return 0
