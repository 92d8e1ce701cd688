"""The ``compare`` report: a results table, time-to-target ratios and plots, as Markdown and HTML.

Every figure comes from a run's own ``summary.json`` and ``metrics.jsonl``
(as :func:`disttrain.launch.commands.train_run` returns them): final test accuracy
and loss, ``wall_seconds``, ``samples_per_second``, ``bytes_sent_per_rank``,
``memory_per_rank`` (the fullest worker's parameters + gradients + optimizer state,
and the largest peak RSS).
Time to target is the ``wall_seconds`` of the first epoch-end evaluation whose
test accuracy reaches the target (evaluations are per epoch, so it is
measured at epoch granularity, evaluation time included, as for every run).
The HTML page embeds the PNGs (base64), so it is one self-contained file.
"""

from __future__ import annotations

import base64
import html
import json
import os
from typing import Any

from disttrain.lab.report_plots import PLOTS, draw_plots
from disttrain.lab.runs import RunResult  # re-exported: compare and the tests import it here

__all__ = [
    "RunResult",
    "held_bytes",
    "result_rows",
    "speedup_lines",
    "time_to_target",
    "write_report",
]

#: the counted terms of ``memory_per_rank`` a worker holds between steps
HELD = ("parameters", "gradients", "optimizer_state")


def time_to_target(run: RunResult, target: float) -> tuple[float, int] | None:
    """(wall seconds, epochs) at the first evaluation with test accuracy >= target, else None."""
    for m in run.evaluations:
        acc = m.get("test_accuracy")
        if acc is not None and acc >= target:
            return float(m["wall_seconds"]), int(m["epoch"]) + 1
    return None


def held_bytes(summary: dict[str, Any]) -> int | None:
    """The fullest worker's parameters + gradients + optimizer state (None: not counted)."""
    memory = summary.get("memory_per_rank") or {}
    if not all(memory.get(k) for k in HELD):
        return None
    return max(sum(parts) for parts in zip(*(memory[k] for k in HELD), strict=True))


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:,.1f}"


def _num(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and value != value):  # None or NaN
        return "-"
    return format(value, fmt)


def result_rows(runs: list[RunResult], target: float) -> list[dict[str, str]]:
    """The results table, one dict of formatted cells per run (the first run is the anchor)."""
    anchor = time_to_target(runs[0], target) if runs else None
    rows = []
    for run in runs:
        s = run.summary
        if s is None:
            rows.append({"run": run.label, "status": f"failed: {run.error}"})
            continue
        reached = time_to_target(run, target)
        rss = (s.get("memory_per_rank") or {}).get("peak_rss") or []
        ratio = "-"
        if reached and anchor:
            ratio = f"{anchor[0] / reached[0]:.2f}x"
        rows.append(
            {
                "run": run.label,
                "status": "ok",
                "final test accuracy": _num(s.get("final_accuracy"), ".4f"),
                "final test loss": _num(s.get("final_test_loss"), ".4f"),
                "wall s": _num(s.get("wall_seconds"), ".1f"),
                "samples/s": _num(s.get("samples_per_second"), ".1f"),
                "bytes/rank": _num(s.get("bytes_sent_per_rank"), ",.0f"),
                "copied/rank": _num(s.get("bytes_copied_per_rank"), ",.0f"),
                f"time to {target:g} (s)": (
                    f"{reached[0]:.1f} (epoch {reached[1]})" if reached else "not reached"
                ),
                "speed-up to target vs first": ratio,
                "steps": str(s.get("steps", "-")),
                "memory/worker MB": _mb(held_bytes(s)),
                "peak RSS MB": _mb(max(rss, default=None)),
            }
        )
    return rows


#: the results table's columns shown in the terminal (the report has them all)
TERMINAL_COLUMNS = (
    "run",
    "status",
    "final test accuracy",
    "wall s",
    "samples/s",
    "bytes/rank",
    "time to",
    "speed-up to target vs first",
)


def print_results(runs: list[RunResult], target: float) -> None:
    """The results table's main columns, in the terminal (``compare`` ends with it)."""
    from rich.console import Console
    from rich.table import Table

    rows = result_rows(runs, target)
    names = [
        c
        for c in next((r for r in rows if r["status"] == "ok"), rows[0])
        if c.startswith(TERMINAL_COLUMNS)
    ]
    table = Table(title=f"compare: {len(runs)} runs, target test accuracy {target:g}")
    for i, name in enumerate(names):  # a narrow terminal wraps the figures, not the labels
        table.add_column(name, justify="left" if i < 2 else "right", no_wrap=i == 0)
    for row in rows:
        table.add_row(*(row.get(name, "") for name in names))
    console = Console()
    if not console.is_terminal:  # a pipe or a file: no width to fit, so no wrapping
        console = Console(width=160)
    console.print(table)


def speedup_lines(runs: list[RunResult], target: float) -> list[str]:
    """Sentences stating each run's time-to-target ratio against the first run."""
    if not runs:
        return []
    first = runs[0]
    anchor = time_to_target(first, target)
    if first.summary is None or anchor is None:
        return [
            f"The first run, {first.label}, did not reach test accuracy {target:g}, "
            "so no time-to-target ratio is given."
        ]
    lines = [f"{first.label} (the anchor) reached test accuracy {target:g} in {anchor[0]:.1f} s."]
    for run in runs[1:]:
        reached = time_to_target(run, target)
        if run.summary is None:
            lines.append(f"{run.label} failed: {run.error}")
        elif reached is None:
            best = max((m.get("test_accuracy") or 0.0 for m in run.evaluations), default=0.0)
            lines.append(f"{run.label} did not reach {target:g} (best {best:.4f}).")
        else:
            ratio = anchor[0] / reached[0]
            word = "sooner" if ratio >= 1 else "later"
            factor = ratio if ratio >= 1 else 1 / ratio
            lines.append(
                f"{run.label} reached it in {reached[0]:.1f} s: {factor:.2f}x {word} than "
                f"{first.label}."
            )
    return lines


def _md_table(rows: list[dict[str, Any]]) -> list[str]:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    out = ["| " + " | ".join(columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
    out += ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in rows]
    return out


def _html_table(rows: list[dict[str, Any]]) -> str:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(r.get(c, '')))}</td>" for c in columns) + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _sections(
    runs: list[RunResult],
    target: float,
    meta: dict[str, Any],
    algorithms: list[dict[str, Any]],
    notes: list[str],
) -> list[tuple[str, list[str], list[dict[str, Any]]]]:
    """(heading, paragraphs, table rows) in report order; plots are added by the writers."""
    about = [f"{k}: {v}" for k, v in meta.items()]
    parts = [
        ("Setting", about, []),
        ("Results", [], result_rows(runs, target)),
        (f"Time to test accuracy {target:g}", speedup_lines(runs, target) + notes, []),
    ]
    if algorithms:
        parts.append(
            (
                "Allreduce algorithms: communication per rank and messages, measured",
                [
                    "One allreduce of the size shown per algorithm, on this machine's "
                    "loopback; bytes and messages are the most any rank sent, counted by "
                    "the byte meter, next to what the algorithm's cost() states. S is the "
                    "tensor size. Steps are the dependent communication rounds by formula.",
                ],
                algorithms,
            )
        )
    return parts


def write_report(
    out_dir: str,
    runs: list[RunResult],
    target: float,
    meta: dict[str, Any],
    algorithms: list[dict[str, Any]] | None = None,
    notes: list[str] | None = None,
) -> dict[str, str]:
    """Write report.md, report.html, runs.json and the PNGs into ``out_dir``; their paths."""
    os.makedirs(out_dir, exist_ok=True)
    pngs = draw_plots(out_dir, runs, target)
    sections = _sections(runs, target, meta, algorithms or [], notes or [])
    title = "disttrain compare: " + ", ".join(r.label for r in runs)
    md, page = _render(title, sections, pngs)
    paths = {"md": os.path.join(out_dir, "report.md"), "html": os.path.join(out_dir, "report.html")}
    with open(paths["md"], "w") as fh:
        fh.write("\n".join(md))
    with open(paths["html"], "w") as fh:
        fh.write("\n".join(page) + "\n")
    paths["runs"] = os.path.join(out_dir, "runs.json")
    _write_runs(paths["runs"], runs, out_dir)
    return {**paths, **pngs}


def _render(title: str, sections: list[Any], pngs: dict[str, str]) -> tuple[list[str], list[str]]:
    """The report's markdown and HTML lines: each section's paragraphs (the Setting as a
    list) and table, then the plots (linked in markdown, inlined as base64 in HTML)."""
    md = [f"# {title}", ""]
    page = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>body{{font-family:sans-serif;"
        "max-width:70em;margin:auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #bbb;padding:2px 6px;text-align:right}"
        "img{max-width:48%}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for heading, paragraphs, rows in sections:
        md += [f"## {heading}", ""]
        page.append(f"<h2>{html.escape(heading)}</h2>")
        if heading == "Setting":
            md += [f"- {p}" for p in paragraphs] + [""]
            page.append("<ul>" + "".join(f"<li>{html.escape(p)}</li>" for p in paragraphs))
            page.append("</ul>")
        else:
            for p in paragraphs:
                md += [p, ""]
                page.append(f"<p>{html.escape(p)}</p>")
        if rows:
            md += [*_md_table(rows), ""]
            page.append(_html_table(rows))
    md += ["## Plots", ""]
    page.append("<h2>Plots</h2>")
    for name, caption in PLOTS.items():
        if name in pngs:
            md += [f"![{caption}]({name})", ""]
            with open(pngs[name], "rb") as fh:
                data = base64.b64encode(fh.read()).decode("ascii")
            page.append(f"<img alt='{html.escape(caption)}' src='data:image/png;base64,{data}'>")
    page.append("</body></html>")
    return md, page


def _write_runs(path: str, runs: list[RunResult], out_dir: str) -> None:
    """runs.json: each run's label, flags, error, summary and folder (relative to the report)."""
    with open(path, "w") as fh:
        json.dump(
            [
                {
                    "label": r.label,
                    "flags": r.flags,
                    "error": r.error,
                    "summary": r.summary,
                    # relative to the report, so the folder moves with it
                    "folder": os.path.relpath(r.folder, out_dir) if r.folder else None,
                }
                for r in runs
            ],
            fh,
            indent=1,
        )
