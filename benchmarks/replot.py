"""Draw the committed benchmark results again with the current plotting code, from their JSON files alone.

For every ``benchmarks/results/<device>/<run>.json`` written by ``tritonkit bench --out``, this draws the run's
plots (``tritonkit.bench.plots``: the spec's swept axis on x, a line per provider at each setting of the other
case keys) and rewrites the run's markdown below its header: the table under the current rules (a row's rate in
its own unit only, "-" where the mode has no cost model) and the list of plots. The ceilings a plot draws come
from the file's ``ceilings`` record, or, in files written before it, from the rows themselves (rate over % of
ceiling), which gives back exactly the ceilings the run was judged against.

``--stamp`` first records in each JSON written before runs carried their time (``meta["time"]``, set by
``tritonkit bench``) the time of the last commit that changed the file, as ``meta["committed"]``: an upper bound of
when the run was taken, which orders the runs of one day for the index (``tritonkit.index.measured``).

``--prune`` then deletes each device folder's PNGs that no result draws any more (plots of runs whose JSON is
gone, plots whose cases all sit at one x) unless a document names the file (README.md, docs/, the results
README), and drops the links to deleted plots from markdown tables left without a JSON.

    python benchmarks/replot.py [RESULTS_DIR] [--stamp] [--prune] [--dry-run]

Plots need matplotlib (``pip install -e '.[bench]'``); no GPU is used.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

from tritonkit.bench import report
from tritonkit.bench.cost import Ceilings
from tritonkit.bench.harness import Measurement

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
TABLE_START = "| kernel |"
CEILINGS_LINE = re.compile(
    r"Ceilings on (?P<device>.+?): copy bandwidth (?P<bw>[\d.]+) GB/s; matmul TFLOP/s: (?P<mm>.*)\.$"
)
_FIELDS = {f.name for f in dataclasses.fields(Measurement)}


def benchmark_runs(device_dir: Path):
    """(json path, record) of every benchmark run in a device folder (calibration and other records skipped)."""
    for path in sorted(device_dir.glob("*.json")):
        record = json.loads(path.read_text())
        rows = record.get("results") if isinstance(record, dict) else None
        if "meta" in record and isinstance(rows, list) and all("spec" in row and "provider" in row for row in rows):
            yield path, record


def measurements(record: dict) -> list[Measurement]:
    return [Measurement(**{key: value for key, value in row.items() if key in _FIELDS}) for row in record["results"]]


def _from_markdown(md_path: Path) -> tuple[str, float, dict[str, float]] | None:
    if not md_path.exists():
        return None
    for line in md_path.read_text().splitlines():
        match = CEILINGS_LINE.match(line)
        if match:
            matmul = dict(item.rsplit(" ", 1) for item in match["mm"].split(", ") if item)
            return match["device"], float(match["bw"]), {name: float(v) for name, v in matmul.items()}
    return None


def ceilings_of(record: dict, md_path: Path) -> Ceilings | None:
    """The ceilings of a run: its record's, else rebuilt from its rows (value * 100 / % of ceiling), completed by
    the markdown's ceilings line (rounded there) for a dtype no row gives."""
    saved = record.get("ceilings")
    if saved:
        return Ceilings(saved["device"], saved["bandwidth_gbps"], dict(saved["matmul_tflops"]))
    bandwidth, matmul = [], {}
    for row in record["results"]:
        percent = row.get("percent_of_ceiling")
        value = row.get("tflops") if row.get("unit") == "TFLOP/s" else row.get("gbps")
        if not percent or not value or row.get("ms") is None:
            continue
        if row.get("unit") == "TFLOP/s":
            matmul.setdefault(row["dtype"], []).append(value * 100 / percent)
        else:
            bandwidth.append(value * 100 / percent)
    line = _from_markdown(md_path)
    device = record["meta"].get("device") or (line[0] if line else None)
    matmul_tflops = {**(line[2] if line else {}), **{dtype: statistics.median(v) for dtype, v in matmul.items()}}
    bandwidth_gbps = statistics.median(bandwidth) if bandwidth else (line[1] if line else None)
    if device is None or bandwidth_gbps is None:
        return None
    return Ceilings(device, bandwidth_gbps, matmul_tflops)


def rewrite_markdown(md_path: Path, results, record: dict, ceilings: Ceilings | None, plot_names) -> None:
    """Keep the markdown's header as written at the run (device, ceilings, command); redo the table and plots."""
    if md_path.exists() and TABLE_START in md_path.read_text():
        text = md_path.read_text()
        header = text[: text.index(TABLE_START)]
    else:
        header = "\n".join(report.markdown_header(record["meta"], ceilings)) + "\n"
    md_path.write_text(header + report.markdown_body(results, plot_names))


def stamp_committed(json_path: Path, record: dict, dry_run: bool) -> str | None:
    """Record the time of the last commit that changed ``json_path`` in its meta, unless it has a time already."""
    meta = record["meta"]
    if meta.get("time") or meta.get("committed"):
        return None
    found = subprocess.run(["git", "log", "-1", "--format=%cI", "--", json_path.name], cwd=json_path.parent,
                           capture_output=True, text=True, check=False)  # fmt: skip
    committed = found.stdout.strip()
    if found.returncode != 0 or not committed:
        return None  # not in a git work tree, or never committed: nothing to record
    meta["committed"] = committed
    if not dry_run:
        json_path.write_text(json.dumps(record, indent=2) + "\n")
    return committed


def _cited_names() -> str:
    """The text of every document that may name a result file."""
    documents = [REPO / "README.md", RESULTS / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    return "\n".join(path.read_text() for path in documents if path.exists())


def _unit_cells(line: str) -> str:
    """A table row written before the unit rule, with its rate in its own unit only (as report.rate_cells)."""
    cells = line.split(" | ")
    if len(cells) != len(report.HEADERS) or not line.startswith("| "):
        return line
    gbps, tflops, percent = (report.HEADERS.index(name) for name in ("GB/s", "TFLOP/s", "% ceiling"))
    if cells[percent].endswith(" GB/s"):
        cells[tflops] = "-"
    elif cells[percent].endswith(" TFLOP/s"):
        cells[gbps] = "-"
        if cells[tflops] in ("0.00", "-"):
            cells[tflops] = cells[percent] = "-"
    return " | ".join(cells)


def tidy_orphan_markdown(md_path: Path) -> bool:
    """A table whose JSON is gone: its rates in their own units, and no links to plots that no longer exist (nor
    an emptied Plots section). True when the file changed."""
    text = md_path.read_text()
    lines = [_unit_cells(line) for line in text.splitlines()]
    kept = [
        line
        for line in lines
        if not (match := re.fullmatch(r"!\[[^\]]*\]\(([^)]+\.png)\)", line)) or (md_path.parent / match[1]).exists()
    ]
    new = "\n".join(kept).rstrip("\n")
    new = re.sub(r"\n+## Plots\s*$", "", new) + "\n"
    if new != text:
        md_path.write_text(new)
        return True
    return False


def _prune(device_dir: Path, results_dir: Path, drawn: set[str], cited: str, dry_run: bool) -> None:
    """Delete the PNGs no result draws, unless a document names the file."""
    for png in sorted(device_dir.glob("*.png")):
        if png.name in drawn:
            continue
        if png.name in cited:
            print(f"kept {png.relative_to(results_dir)}: no result draws it, but a document names it")
            continue
        print(f"deleted {png.relative_to(results_dir)}")
        if not dry_run:
            png.unlink()


def replot(results_dir: Path, prune: bool, dry_run: bool, stamp: bool = False) -> int:
    cited = _cited_names() if prune else ""
    for device_dir in sorted(p for p in results_dir.iterdir() if p.is_dir()):
        drawn: set[str] = set()
        for json_path, record in benchmark_runs(device_dir):
            if stamp and (committed := stamp_committed(json_path, record, dry_run)):
                print(f"{json_path.relative_to(results_dir)}: committed {committed}")
            results = measurements(record)
            md_path = json_path.with_suffix(".md")
            ceilings = ceilings_of(record, md_path)
            planned = report.planned_plots(json_path.stem, results)
            names = [name for name, _ in planned]
            drawn.update(names)
            print(f"{json_path.relative_to(results_dir)}: {len(names)} plots")
            if dry_run:
                continue
            report.write_plots(device_dir, json_path.stem, results, ceilings)
            rewrite_markdown(md_path, results, record, ceilings, names)
        if prune:
            _prune(device_dir, results_dir, drawn, cited, dry_run)
        for md_path in sorted(device_dir.glob("*.md")):
            orphan = md_path.read_text().startswith("# Benchmark:") and not md_path.with_suffix(".json").exists()
            if orphan and not dry_run and tidy_orphan_markdown(md_path):
                print(f"{md_path.relative_to(results_dir)} (no JSON): rates in their units, plot links checked")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", default=str(RESULTS), help="the results folder (default: the repo's)")
    parser.add_argument("--stamp", action="store_true", help="record each old run's last commit time in its JSON")
    parser.add_argument("--prune", action="store_true", help="delete the PNGs no result draws (unless cited)")
    parser.add_argument("--dry-run", action="store_true", help="say what would be drawn and deleted; write nothing")
    args = parser.parse_args(argv)
    missing = report.plots.matplotlib_missing()
    if missing and not args.dry_run:
        print(f"cannot draw: {missing}", file=sys.stderr)
        return 2
    return replot(Path(args.results), args.prune, args.dry_run, args.stamp)


if __name__ == "__main__":
    sys.exit(main())
