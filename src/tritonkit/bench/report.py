"""Benchmark reports: a terminal table, and JSON, markdown and PNG plots (:mod:`.plots`) under ``--out``.

A row shows its rate in its own unit only: GB/s and % of the bandwidth for a memory-bound kernel, TFLOP/s and %
of the matmul ceiling for a compute-bound one; a mode without a cost model shows "-" in those cells.
"""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from tritonkit._core.text import format_table
from tritonkit.bench import plots
from tritonkit.bench.cost import Ceilings
from tritonkit.bench.harness import GRAPH_REPLAY_MS, Measurement

HEADERS = [
    "kernel",
    "case",
    "dtype",
    "mode",
    "provider",
    "ms",
    "GB/s",
    "TFLOP/s",
    "% ceiling",
    "speed-up",
    "peak MiB",
    "note",
]


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def rate_cells(r: Measurement) -> tuple[str, str, str]:
    """(GB/s, TFLOP/s, % ceiling) cells: the row's unit only; "-" without a cost model for its mode (results
    written before this rule carry 0.0 there, read as none)."""
    value = r.tflops if r.unit == "TFLOP/s" else r.gbps
    if value is None or value <= 0:
        return "-", "-", "-"
    percent = "-" if r.percent_of_ceiling is None else f"{r.percent_of_ceiling:.1f}% {r.unit}"
    if r.unit == "TFLOP/s":
        return "-", f"{value:.2f}", percent
    return f"{value:.1f}", "-", percent


def _note(r: Measurement) -> str:
    """The note cell: input sets past one, and the GPU's clocks while timed (tritonkit.bench.clocks)."""
    parts = [] if r.input_sets == 1 else [f"{r.input_sets} input sets"]
    if r.sm_mhz is not None:
        parts.append(", ".join([f"SM {r.sm_mhz:.0f} MHz", f"{r.power_w:.0f} W", *filter(None, [r.slowdowns])]))
    return "; ".join(parts)


def rows_for_table(results: Sequence[Measurement]) -> list[list[str]]:
    rows = []
    for r in results:
        if r.skipped:
            rows.append([r.spec, r.case_id, r.dtype, r.mode, r.provider] + ["-"] * 6 + [f"skipped: {r.skipped}"])
            continue
        rows.append(
            [
                r.spec,
                r.case_id,
                r.dtype,
                r.mode,
                r.provider,
                _fmt(r.ms, ".4f"),
                *rate_cells(r),
                _fmt(r.speedup_vs_best_baseline, ".2f") + ("x" if r.ms else ""),
                _fmt(r.peak_mib, ".1f"),
                _note(r),
            ]
        )
    return rows


def terminal_table(results: Sequence[Measurement]) -> str:
    return format_table(HEADERS, rows_for_table(results))


def markdown_table(results: Sequence[Measurement]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for row in rows_for_table(results):
        lines.append("| " + " | ".join(cell.replace("|", "/") for cell in row) + " |")
    return "\n".join(lines)


def ceilings_line(ceilings: Ceilings | None) -> str:
    if ceilings is None:
        return "Ceilings: not calibrated (no % of ceiling)."
    matmul = ", ".join(f"{name} {value:.0f}" for name, value in sorted(ceilings.matmul_tflops.items()))
    return (
        f"Ceilings on {ceilings.device}: copy bandwidth {ceilings.bandwidth_gbps:.0f} GB/s; matmul TFLOP/s: {matmul}."
    )


def ceilings_record(ceilings: Ceilings | None) -> dict | None:
    if ceilings is None:
        return None
    return {"device": ceilings.device, "bandwidth_gbps": ceilings.bandwidth_gbps,
            "matmul_tflops": dict(ceilings.matmul_tflops)}  # fmt: skip


def write_json(path: Path, results: Sequence[Measurement], meta: dict, ceilings: Ceilings | None = None) -> Path:
    """Every row and the run's metadata, with the ceilings the percentages were taken against (what a plot needs
    to be drawn again from this file alone: ``benchmarks/replot.py``)."""
    record = {"meta": meta, "ceilings": ceilings_record(ceilings), "results": [r.to_dict() for r in results]}
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def write_record(out: Path, name: str, record: dict) -> Path:
    """``record`` (a sweep script's own rows and metadata) as ``<out>/<today>-<name>.json``, the results folder's
    naming; prints and returns the path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{datetime.date.today().isoformat()}-{name}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")
    return path


def environment(dry_run: bool = False) -> dict:
    """The device ("cpu (dry run)" for a dry run), torch and triton a run measured with, as reports record them."""
    import torch
    import triton

    device = "cpu (dry run)" if dry_run else torch.cuda.get_device_name()
    return {"device": device, "torch": torch.__version__, "triton": triton.__version__}


def script_command(argv: Sequence[str] | None) -> str:
    """The command line of a benchmarks/ script's run, as reports record it (argv: its arguments, or sys.argv's)."""
    return " ".join([f"python benchmarks/{Path(sys.argv[0]).name}", *(argv if argv is not None else sys.argv[1:])])


def markdown_header(meta: dict, ceilings: Ceilings | None) -> list[str]:
    graphs = f" over CUDA-graph replays of {GRAPH_REPLAY_MS:g} ms of work or more" if meta.get("cuda_graph") else ""
    timing = ("Dry run: tiny sizes, no timing." if meta.get("dry_run")
              else f"Timing: median of triton.testing.do_bench{graphs}, input sets rotated past L2.")  # fmt: skip
    return [
        f"# Benchmark: {meta.get('what', '')}",
        "",
        f"Device: {meta.get('device', '?')}; torch {meta.get('torch', '?')}, triton {meta.get('triton', '?')}; "
        f"{meta.get('date', '?')}. {timing}",
        "",
        ceilings_line(ceilings),
        "",
        f"Command: `{meta.get('command', '')}`",
        "",
    ]


def markdown_body(results: Sequence[Measurement], plot_names: Sequence[str] = (), skipped: str | None = None) -> str:
    """The table, then the plots (or why there are none)."""
    lines = [markdown_table(results)]
    if plot_names:
        lines += ["", "## Plots", ""] + [f"![{Path(name).stem}]({name})" for name in plot_names]
    elif skipped:
        lines += ["", f"Plots skipped: {skipped}."]
    return "\n".join(lines) + "\n"


def write_markdown(
    path: Path,
    results: Sequence[Measurement],
    meta: dict,
    ceilings: Ceilings | None,
    plot_names: Sequence[str] = (),
    skipped: str | None = None,
) -> Path:
    path.write_text("\n".join(markdown_header(meta, ceilings)) + "\n" + markdown_body(results, plot_names, skipped))
    return path


def _axis_for(kernel: str) -> str | None:
    """A registered kernel's swept axis (None for a kernel the registry no longer has: plots infer one)."""
    from tritonkit import catalog

    try:
        return catalog.get(kernel).sweep or None
    except KeyError:
        return None


def _as_rows(results: Sequence[Measurement | Mapping]) -> list[Mapping]:
    return [r.to_dict() if isinstance(r, Measurement) else r for r in results]


def planned_plots(stem: str, results: Sequence[Measurement | Mapping]) -> list[tuple[str, plots.PlotGroup]]:
    """(file name, group) of every plot the results make (see :mod:`tritonkit.bench.plots`), before drawing."""
    return [(group.filename(stem), group) for group in plots.plot_groups(_as_rows(results), _axis_for)]


def write_plots(
    directory: Path, stem: str, results: Sequence[Measurement | Mapping], ceilings: Ceilings | None
) -> list[Path]:
    """One PNG per plot group: the swept axis on x, the kernel's unit on y, a line per provider, the device ceiling
    dashed. Needs matplotlib."""
    return [plots.draw(group, directory / name, ceilings) for name, group in planned_plots(stem, results)]


def write_all(
    directory: Path, stem: str, results: Sequence[Measurement], meta: dict, ceilings: Ceilings | None
) -> list[Path]:
    """JSON, then markdown, then the plots, so that a run keeps its numbers whatever happens to the drawing.
    Without matplotlib the plots are skipped, and the markdown and stderr say so. The JSON's meta gains the time it
    was written (``time``, UTC), which orders the runs of one day (the index shows the latest)."""
    directory.mkdir(parents=True, exist_ok=True)
    meta = {
        **meta,
        "time": meta.get("time") or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    json_path = write_json(directory / f"{stem}.json", results, meta, ceilings)
    planned = planned_plots(stem, results)
    skipped = plots.matplotlib_missing() if planned else None
    names = [] if skipped else [name for name, _ in planned]
    md_path = write_markdown(directory / f"{stem}.md", results, meta, ceilings, names, skipped)
    if skipped:
        print(f"plots skipped: {skipped}; wrote the JSON and markdown only", file=sys.stderr)
        return [json_path, md_path]
    drawn = [plots.draw(group, directory / name, ceilings) for name, group in planned]
    return [json_path, md_path, *drawn]
