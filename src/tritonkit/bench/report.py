"""Benchmark reports: a terminal table, and JSON, markdown and one PNG plot per sweep under ``--out``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tritonkit._core.text import format_table
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


def rows_for_table(results: Sequence[Measurement]) -> list[list[str]]:
    rows = []
    for r in results:
        if r.skipped:
            rows.append([r.spec, r.case_id, r.dtype, r.mode, r.provider] + ["-"] * 6 + [f"skipped: {r.skipped}"])
            continue
        percent = "-" if r.percent_of_ceiling is None else f"{r.percent_of_ceiling:.1f}% {r.unit}"
        rows.append(
            [
                r.spec,
                r.case_id,
                r.dtype,
                r.mode,
                r.provider,
                _fmt(r.ms, ".4f"),
                _fmt(r.gbps, ".1f"),
                _fmt(r.tflops, ".2f"),
                percent,
                _fmt(r.speedup_vs_best_baseline, ".2f") + ("x" if r.ms else ""),
                _fmt(r.peak_mib, ".1f"),
                "" if r.input_sets == 1 else f"{r.input_sets} input sets",
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


def write_json(path: Path, results: Sequence[Measurement], meta: dict) -> Path:
    path.write_text(json.dumps({"meta": meta, "results": [r.to_dict() for r in results]}, indent=2) + "\n")
    return path


def write_markdown(
    path: Path, results: Sequence[Measurement], meta: dict, ceilings: Ceilings | None, plots: Sequence[Path] = ()
) -> Path:
    lines = [
        f"# Benchmark: {meta.get('what', '')}",
        "",
        f"Device: {meta.get('device', '?')}; torch {meta.get('torch', '?')}, triton {meta.get('triton', '?')}; "
        f"{meta.get('date', '?')}. Timing: median of triton.testing.do_bench"
        f"{f' over CUDA-graph replays of {GRAPH_REPLAY_MS:g} ms of work or more' if meta.get('cuda_graph') else ''}, "
        "input sets rotated past L2.",
        "",
        ceilings_line(ceilings),
        "",
        f"Command: `{meta.get('command', '')}`",
        "",
        markdown_table(results),
    ]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{plot.stem}]({plot.name})" for plot in plots]
    path.write_text("\n".join(lines) + "\n")
    return path


def _sweep_x(case: dict) -> tuple[str, float]:
    """The x value of a case in a plot: its first numeric parameter (n, h, m, ...)."""
    for key, value in case.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return key, float(value)
    return "case", 0.0


def write_plots(directory: Path, stem: str, results: Sequence[Measurement], ceilings: Ceilings | None) -> list[Path]:
    """One PNG per sweep (kernel x dtype x mode with two or more timed cases and a cost model): size on x, the kernel's
    unit on y, a line per provider, the device ceiling dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps: dict[tuple[str, str, str], list[Measurement]] = {}
    for r in results:
        if r.ms is not None and r.gbps is not None:
            sweeps.setdefault((r.spec, r.dtype, r.mode), []).append(r)
    paths = []
    for (spec, dtype, mode), rows in sweeps.items():
        if len({r.case_id for r in rows}) < 2:
            continue
        unit = rows[0].unit
        figure, axes = plt.subplots(figsize=(7, 4.5))
        for provider in dict.fromkeys(r.provider for r in rows):
            points = sorted(
                (_sweep_x(r.case)[1], r.tflops if unit == "TFLOP/s" else r.gbps) for r in rows if r.provider == provider
            )
            axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=provider)
        if ceilings is not None:
            ceiling = ceilings.matmul_tflops.get(dtype) if unit == "TFLOP/s" else ceilings.bandwidth_gbps
            if ceiling:
                axes.axhline(ceiling, linestyle="--", color="grey", label=f"device ceiling {ceiling:.0f} {unit}")
        axes.set_xscale("log", base=2)
        axes.set_xlabel(_sweep_x(rows[0].case)[0])
        axes.set_ylabel(unit)
        axes.set_title(f"{spec} {dtype} {mode}" + (f" on {ceilings.device}" if ceilings else ""))
        axes.grid(True, alpha=0.3)
        axes.legend()
        path = directory / f"{stem}-{spec}-{dtype}-{mode.replace('+', '-')}.png"
        figure.tight_layout()
        figure.savefig(path, dpi=110)
        plt.close(figure)
        paths.append(path)
    return paths


def write_all(
    directory: Path, stem: str, results: Sequence[Measurement], meta: dict, ceilings: Ceilings | None
) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    plots = write_plots(directory, stem, results, ceilings)
    json_path = write_json(directory / f"{stem}.json", results, meta)
    md_path = write_markdown(directory / f"{stem}.md", results, meta, ceilings, plots)
    return [json_path, md_path, *plots]
