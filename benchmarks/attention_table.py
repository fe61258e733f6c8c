"""Attention against its peers in one run: tritonkit.ops.attention, SDPA with its FlashAttention-2 backend and with
its cuDNN backend forced, and FlexAttention compiled (tritonkit.bench.attention_peers), each timed in this process
as CUDA-graph GPU time (tritonkit.bench.harness.measure_case) on the same bfloat16 inputs.

    python benchmarks/attention_table.py --out DIR [--quick] [--rows NAME,PATTERN...] [--dry-run]
    python benchmarks/attention_table.py --from-json DIR/<date>-attention-table.json   # the table and charts again

TFLOP/s from the specs' cost models: 4·B·H·Sq·Sk·D for the forward, half of it when causal, the exact count of
visible pairs with a window; fwd+bwd is 3.5 times the forward. The varlen rows run tritonkit.ops.attention_varlen over
4 sequences of the dense row's length (the same tokens as its batch of 4) and compare it with the dense kernel; the
peers' cells there are their dense times. A provider that cannot run a row is recorded with the reason (a refusal,
such as SDPA's missing sliding window, or the error it raised) and the run goes on.

Writes into DIR: ``<date>-attention-table.json`` and ``.md`` (every measurement, as ``tritonkit bench`` writes them,
which the index reads), ``<date>-attention-table-peers.md`` (the comparison: each provider's time and TFLOP/s,
tritonkit's speed-up over cuDNN and over FlexAttention) and a bar chart per mode (``...-peers-fwd.png``,
``...-peers-fwd-bwd.png``) when matplotlib is installed.

``--dry-run`` checks the script end to end on the CPU: every row at a tiny size, each provider called once in
float32 (tritonkit under TRITON_INTERPRET=1, FlexAttention eager because compiling it for the CPU takes minutes, cuDNN
failing for want of a GPU), forward outputs compared with the spec's float64 reference; no times.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import os
import sys
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path

PEERS = ("sdpa-flash", "sdpa-cudnn", "flex")
COLUMNS = {"tritonkit": "tritonkit", "sdpa-flash": "SDPA FA2", "sdpa-cudnn": "SDPA cuDNN",
           "flex": "FlexAttention (compiled)"}  # fmt: skip
REFUSED = "failed: Unsupported: "  # how measure_case records a peer's refusal (attention_peers.Unsupported)


@dataclass(frozen=True)
class Row:
    """One line of the table: an attention case (keys of the spec's AttentionCase) in one mode. ``varlen``: the
    lengths of the packed sequences tritonkit's varlen op runs in place of the dense ``case`` (which the peers run)."""

    name: str
    label: str
    mode: str
    case: dict
    varlen: tuple[int, ...] | None = None
    quick: bool = False


def _case(b=4, h=32, hk=None, n=4096, d=128, **options) -> dict:
    return {"b": b, "hq": h, "hk": hk or h, "sq": n, "sk": n, "d": d, **options}


WINDOW_SOFTCAP = _case(causal=True, left=1024, softcap=50.0)


def _pair(name: str, label: str, case: dict, quick: bool = False, varlen=None) -> tuple[Row, Row]:
    return (Row(f"fwd-{name}", label, "fwd", case, varlen, quick),
            Row(f"fwd+bwd-{name}", label, "fwd+bwd", case, varlen, quick))  # fmt: skip


ROWS: tuple[Row, ...] = (
    *_pair("noncausal", "non-causal, B4 H32 N4096 d128", _case(), quick=True),
    *_pair("causal", "causal, B4 H32 N4096 d128", _case(causal=True), quick=True),
    Row("fwd-gqa", "causal, GQA 32:8, B4 N4096 d128", "fwd", _case(hk=8, causal=True), quick=True),
    Row("fwd-d64", "non-causal, B2 H16 N8192 d64", "fwd", _case(b=2, h=16, n=8192, d=64)),
    *_pair("window", "causal, window 1024, softcap 50, B4 H32 N4096 d128", WINDOW_SOFTCAP, quick=True),
    *_pair("d256", "causal, B2 H16 N4096 d256", _case(b=2, h=16, d=256, causal=True)),
    *_pair("n8192", "causal, B2 H32 N8192 d128", _case(b=2, n=8192, causal=True)),
    *_pair("n16384", "causal, B1 H32 N16384 d128", _case(b=1, n=16384, causal=True)),
    *_pair("varlen", "varlen 4 × 4096, causal, H32 d128 (peers: dense B4)", _case(causal=True), varlen=(4096,) * 4),
)


def select_rows(quick: bool, patterns: str | None) -> list[Row]:
    rows = [row for row in ROWS if row.quick or not quick]
    if patterns:
        wanted = [p.strip() for p in patterns.split(",") if p.strip()]
        rows = [row for row in rows if any(fnmatch.fnmatchcase(row.name, p) for p in wanted)]
        if not rows:
            raise SystemExit(f"--rows {patterns!r} matches none of: {', '.join(row.name for row in ROWS)}")
    return rows


def tiny(row: Row) -> Row:
    """The row at a size the CPU runs in moments, keeping what makes it that row (GQA ratio, window, softcap)."""
    case, group = row.case, row.case["hq"] // row.case["hk"]
    n = 16 if row.varlen else 48
    small = {**case, "b": len(row.varlen) if row.varlen else 1, "hq": 4, "hk": max(1, 4 // group), "sq": n, "sk": n}
    if case.get("left", -1) >= 0:
        small["left"] = 8
    return replace(row, case=small, varlen=(n,) * len(row.varlen) if row.varlen else None)


def varlen_case(row: Row) -> dict:
    keys = ("causal", "left", "right", "softcap")
    return {"lens_q": row.varlen, "hq": row.case["hq"], "hk": row.case["hk"], "d": row.case["d"],
            **{key: row.case[key] for key in keys if key in row.case}}  # fmt: skip


# ---------------------------------------------------------------- running


def _specs():
    from tritonkit import catalog

    return catalog.get("attention"), catalog.get("attention_varlen")


def _run(rows: list[Row], time_one) -> tuple[list, list[dict]]:
    """Every row's measurements through ``time_one(spec, case, mode, providers)`` (a dense case measured once for
    all the rows that need it), and the table's record of which measurements each row reads."""
    import tritonkit.ops
    from tritonkit.bench.providers import Provider, select_providers

    attention, varlen = _specs()
    dense_providers = select_providers(attention, ("tritonkit", *PEERS))
    varlen_providers = [Provider("tritonkit", tritonkit.ops.attention_varlen)]
    results, done, table = [], set(), []
    for index, row in enumerate(rows, 1):
        print(f"[{index}/{len(rows)}] {row.name}: {row.label}", file=sys.stderr, flush=True)
        case = attention.parse_case(row.case)
        entry = {"name": row.name, "label": row.label, "mode": row.mode, "case_id": attention.case_id(case)}
        if (entry["case_id"], row.mode) not in done:
            done.add((entry["case_id"], row.mode))
            results += time_one(attention, case, row.mode, dense_providers)
        if row.varlen:
            packed = varlen.parse_case(varlen_case(row))
            entry["varlen_case_id"] = varlen.case_id(packed)
            results += time_one(varlen, packed, row.mode, varlen_providers)
        table.append(entry)
    return results, table


def timed(rows: list[Row]) -> tuple[list, list[dict], object]:
    """CUDA-graph GPU time of every provider on every row, bfloat16, against the calibrated ceilings."""
    import torch

    from tritonkit.bench import calibrate
    from tritonkit.bench.harness import measure_case

    ceilings = calibrate.load_or_calibrate()

    def time_one(spec, case, mode, providers):
        return measure_case(spec, case, torch.bfloat16, mode, providers, ceilings, cuda_graph=True)

    results, table = _run(rows, time_one)
    return results, table, ceilings


def dry(rows: list[Row]) -> tuple[list, list[dict]]:
    """Each provider once per tiny row on the CPU; the forward's largest error against the float64 reference is
    written in the row's ``skipped`` field as ``dry run: ...`` (there is no time to show)."""
    import torch

    from tritonkit.bench import attention_peers
    from tritonkit.bench.harness import Measurement, make_step
    from tritonkit.bench.providers import Provider

    def time_one(spec, case, mode, providers):
        providers = [Provider("flex", attention_peers.flex_attention(compiled=False)) if p.name == "flex" else p
                     for p in providers]  # fmt: skip
        out = []
        for provider in providers:
            row = Measurement(spec.name, spec.family, dict(case), spec.case_id(case), "float32", mode, provider.name)
            out.append(row)
            if provider.fn is None:
                row.skipped = provider.skip_reason
                continue
            inputs = spec.make_inputs(case, "cpu", torch.float32, torch.Generator().manual_seed(0))
            try:
                result = make_step(provider.fn, inputs, mode)()
            except Exception as error:  # recorded as the GPU run records it
                first_line = str(error).splitlines()[0][:160] if str(error) else ""
                row.skipped = f"failed: {type(error).__name__}: {first_line}"
                continue
            if mode == "fwd":
                as64 = [a.detach().double() if torch.is_tensor(a) and a.is_floating_point() else a for a in inputs.args]
                error = (result.double() - spec.reference(*as64, **inputs.kwargs)).abs().max().item()
                row.skipped = f"dry run: ran; max abs error {error:.1e} against the float64 reference"
            else:
                finite = all(g is not None and bool(torch.isfinite(g).all()) for g in result)
                row.skipped = f"dry run: ran; {len(result)} gradients, {'finite' if finite else 'NOT FINITE'}"
        return out

    return _run([tiny(row) for row in rows], time_one)


# ---------------------------------------------------------------- the comparison


def _by_key(results: list[dict]) -> dict[tuple, dict]:
    return {(r["spec"], r["case_id"], r["mode"], r["provider"]): r for r in results}


def _cell(row: dict | None, notes: dict[str, int], column: str) -> str:
    """Time and rate, or "n/a [n]" with the reason as footnote n (one footnote per distinct reason)."""
    if row is None:
        return "-"
    if row.get("ms") is not None:
        rate = f", {row['tflops']:.0f} TFLOP/s" if row.get("tflops") else ""
        return f"{row['ms']:.3f} ms{rate}"
    reason = row.get("skipped") or "not timed"
    if reason.startswith("dry run: "):
        return reason.removeprefix("dry run: ")
    note = notes.setdefault(f"{column}: {reason.replace(REFUSED, 'refused: ')}", len(notes) + 1)
    return f"n/a [{note}]"


def _ratio(theirs: dict | None, ours: dict | None) -> str:
    if not theirs or not ours or theirs.get("ms") is None or ours.get("ms") is None:
        return "-"
    return f"{theirs['ms'] / ours['ms']:.2f}×"


def comparison(results: list[dict], table: list[dict]) -> tuple[list[dict], list[str]]:
    """The table's lines (cells by column, ratios, tritonkit's and each peer's TFLOP/s) and its footnotes."""
    found, lines, notes = _by_key(results), [], {}
    for entry in table:
        dense = {name: found.get(("attention", entry["case_id"], entry["mode"], name)) for name in COLUMNS}
        ours = dense["tritonkit"]
        extra = ""
        if "varlen_case_id" in entry:
            ours = found.get(("attention_varlen", entry["varlen_case_id"], entry["mode"], "tritonkit"))
            dense_ms, varlen_ms = (dense["tritonkit"] or {}).get("ms"), (ours or {}).get("ms")
            if dense_ms and varlen_ms:
                extra = f"dense tritonkit {dense_ms:.3f} ms; varlen / dense {varlen_ms / dense_ms:.2f}"
        cells = {name: _cell(ours if name == "tritonkit" else dense[name], notes, column)
                 for name, column in COLUMNS.items()}  # fmt: skip
        rates = {"tritonkit": (ours or {}).get("tflops"), **{name: (dense[name] or {}).get("tflops") for name in PEERS}}
        lines.append({**entry, "cells": cells, "rates": rates, "vs_cudnn": _ratio(dense["sdpa-cudnn"], ours),
                      "vs_flex": _ratio(dense["flex"], ours), "note": extra})  # fmt: skip
    return lines, list(notes)


def comparison_markdown(lines: list[dict], notes: list[str], meta: dict, charts: list[str]) -> str:
    head = ["case", "mode", *COLUMNS.values(), "vs cuDNN", "vs Flex", "note"]
    text = [
        "# Attention against its peers",
        "",
        f"Device: {meta.get('device', '?')}; torch {meta.get('torch', '?')}, triton {meta.get('triton', '?')}; "
        f"{meta.get('date', '?')}. {meta.get('timing', '')}",
        "",
        "Cells: median ms and TFLOP/s (forward 4·B·H·Sq·Sk·D, half when causal, the visible pairs exactly with a "
        "window; fwd+bwd 3.5 times the forward). vs cuDNN, vs Flex: their time over tritonkit's (above 1: tritonkit "
        "is faster). The varlen rows' peers ran the dense batch of the same tokens.",
        "",
        f"Command: `{meta.get('command', '')}`",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for line in lines:
        cells = [line["label"], line["mode"], *line["cells"].values(), line["vs_cudnn"], line["vs_flex"], line["note"]]
        text.append("| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |")
    if notes:
        text += ["", *(f"[{index}] {note}" for index, note in enumerate(notes, 1))]
    if charts:
        text += ["", *(f"![{Path(name).stem}]({name})" for name in charts)]
    return "\n".join(text) + "\n"


def draw_chart(lines: list[dict], mode: str, path: Path, title: str) -> Path | None:
    """Grouped bars: a group per row of ``mode``, a bar per provider (TFLOP/s), colours as the bench plots'. None
    when no row of the mode has a rate (a dry run)."""
    chosen = [line for line in lines if line["mode"] == mode]
    if not any(rate for line in chosen for rate in line["rates"].values()):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tritonkit.bench.plots import STYLES

    width = 0.8 / len(COLUMNS)
    figure, axes = plt.subplots(figsize=(max(6.0, 1.6 * len(chosen) + 2), 4.8))
    for index, (name, column) in enumerate(COLUMNS.items()):
        xs = [position + (index - (len(COLUMNS) - 1) / 2) * width for position in range(len(chosen))]
        heights = [line["rates"][name] or 0.0 for line in chosen]
        axes.bar(xs, heights, width, label=column, color=STYLES[name]["color"])
        for x, height in zip(xs, heights, strict=True):
            if not height:
                axes.text(x, 0, "n/a", rotation=90, ha="center", va="bottom", fontsize=7)
    axes.set_xticks(range(len(chosen)), [textwrap.fill(line["label"], 18) for line in chosen], fontsize=7)
    highest = max(rate or 0.0 for line in chosen for rate in line["rates"].values())
    axes.set_ylim(0, 1.2 * highest)  # room for the legend above the bars
    axes.set_ylabel("TFLOP/s")
    axes.set_title(title, fontsize=11)
    axes.grid(True, axis="y", alpha=0.3)
    axes.legend(fontsize=8, ncol=len(COLUMNS), loc="upper center")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def write_comparison(directory: Path, stem: str, results: list[dict], meta: dict) -> list[Path]:
    from tritonkit.bench.plots import matplotlib_missing

    lines, notes = comparison(results, meta["rows"])
    charts = []
    if matplotlib_missing() is None:
        for mode in dict.fromkeys(line["mode"] for line in lines):
            title = f"attention {mode}, {meta.get('dtype', '')} on {meta.get('device', '?')}"
            drawn = draw_chart(lines, mode, directory / f"{stem}-peers-{mode.replace('+', '-')}.png", title)
            charts += [drawn] if drawn else []
    markdown = directory / f"{stem}-peers.md"
    markdown.write_text(comparison_markdown(lines, notes, meta, [path.name for path in charts]))
    print(markdown.read_text())
    return [markdown, *charts]


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="the folder to write into")
    parser.add_argument("--quick", action="store_true", help="the rows marked quick only")
    parser.add_argument("--rows", help="comma-separated row names or patterns (fwd-*, *varlen)")
    parser.add_argument("--dry-run", action="store_true", help="tiny rows on the CPU, each provider once, no times")
    parser.add_argument("--from-json", help="write the comparison and charts again from a run's JSON")
    args = parser.parse_args(argv)
    if args.from_json:
        path = Path(args.from_json)
        record = json.loads(path.read_text())
        write_comparison(path.parent, path.stem, record["results"], record["meta"])
        return 0
    if not args.out:
        parser.error("--out is required (unless --from-json)")
    rows = select_rows(args.quick, args.rows)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is defined (the catalog imports them)
    import torch

    from tritonkit.bench import report

    if args.dry_run:
        results, table = dry(rows)
        ceilings, timing = None, "Dry run: tiny sizes, float32, each provider called once."
    else:
        if not torch.cuda.is_available():
            parser.error("timing needs a CUDA GPU (--dry-run checks the script on the CPU)")
        results, table, ceilings = timed(rows)
        timing = "Timing: median of triton.testing.do_bench over CUDA-graph replays, all providers in one process."
    date = datetime.date.today().isoformat()
    meta = {"what": "attention-table", **report.environment(args.dry_run), "date": date,
            "dtype": "float32" if args.dry_run else "bfloat16", "cuda_graph": not args.dry_run,
            "sizes": "given cases", "dry_run": args.dry_run, "timing": timing, "rows": table,
            "command": report.script_command(argv)}  # fmt: skip
    out, stem = Path(args.out), f"{date}-attention-table"
    written = report.write_all(out, stem, results, meta, ceilings)
    written += write_comparison(out, stem, [r.to_dict() for r in results], meta)
    print("wrote " + ", ".join(str(path) for path in written), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
