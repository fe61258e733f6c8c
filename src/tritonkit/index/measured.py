"""What our kernels measured, for the index: per kernel a row for each of fwd, bwd and fwd+bwd, tritonkit against
torch eager, torch.compile and liger-kernel, and against any other peer timed beside it (attention: SDPA's flash and
cuDNN backends, FlexAttention), in ms, with the speed-up over the fastest of them, the device and the date. Every
kernel's table has the three standard columns; a kernel with other peers has a column for each of them after those.

One summary, two sources. In a source checkout it is built afresh from ``benchmarks/results/<device>/*.json``
(:func:`summarize`); an installed wheel has no such folder, and reads ``measured.json`` beside this module, which
``tritonkit index measured`` writes from those files and a test keeps equal to them. Plots live only in the results
folder: without it, an entry has its numbers but no plots.

Which run and case a row shows: among the runs that time tritonkit on the kernel in that mode, those that time a
baseline beside it at their headline case (when any does); of those the newest by date; then bfloat16; then runs
over the spec's bench cases (``--sizes default`` or ``sweep``) before ``small`` runs, before hand-picked
``--case`` ones; then the latest in the day (the run's ``time``, or for older files the ``committed`` time that
``benchmarks/replot.py --stamp`` recorded); then the most baselines timed; then the larger headline case
(its work); then CUDA-graph timing (device time, no host launch cost) before eager; then the later file name.
Inside a run, the headline case is bfloat16 where there is one, with the most baselines timed, then the largest
(the most bytes moved or FLOPs run), then the first. A baseline is any provider but tritonkit: the standard three and
the other peers alike.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tritonkit.bench.plots import plot_groups

MODES = ("fwd", "bwd", "fwd+bwd")
BASELINES = ("torch", "torch.compile", "liger")  # the columns every kernel's table has
BASELINE_NAMES = {"torch": "torch eager", "torch.compile": "torch.compile", "liger": "liger-kernel",
                  "sdpa-flash": "SDPA flash", "sdpa-cudnn": "SDPA cuDNN", "flex": "FlexAttention"}  # fmt: skip
PREFERRED_DTYPE = "bfloat16"
# `tritonkit bench --sizes`: the spec's larger bench cases or all of them, before its two smallest (launch-bound),
# before hand-picked --case ones ("given cases").
SIZES_RANK = {"default": 2, "sweep": 2, "small": 1}
MAX_PLOTS = 3
NO_MEASUREMENT = "not measured yet"
SUMMARY_FILE = Path(__file__).resolve().parent / "measured.json"
TABLE_HEADERS = ["mode", "case", "dtype", "tritonkit ms", "torch eager ms", "torch.compile ms", "liger-kernel ms",
                 "speed-up", "tritonkit rate", "timing", "device", "date"]  # fmt: skip


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def baseline_name(provider: str) -> str:
    """How tables name a provider: its library's name, or the provider's own for a peer without one here."""
    return BASELINE_NAMES.get(provider, provider)


def table_headers(peers: Sequence[str] = ()) -> list[str]:
    """TABLE_HEADERS with a column for each other peer after the standard baselines' columns."""
    at = TABLE_HEADERS.index("speed-up")
    return [*TABLE_HEADERS[:at], *(f"{baseline_name(name)} ms" for name in peers), *TABLE_HEADERS[at:]]


@dataclass(frozen=True)
class ModeRow:
    """tritonkit and the baselines on one case of one run, in one mode."""

    mode: str
    case_id: str
    dtype: str
    device: str
    date: str
    cuda_graph: bool
    source: str  # the run's JSON, relative to the results folder
    ms: dict  # provider -> median ms: the standard baselines always (None: not timed), other peers when timed
    unit: str
    rate: float | None  # tritonkit's, in ``unit``; None where the mode has no cost model
    percent_of_ceiling: float | None
    plot: str | None = None  # the run's plot holding this case, relative to the results folder

    @property
    def peers(self) -> list[str]:
        """The providers timed beside tritonkit other than the standard baselines, in the run's order."""
        return [name for name in self.ms if name not in ("tritonkit", *BASELINES)]

    @property
    def best_baseline(self) -> str | None:
        timed = [name for name in (*BASELINES, *self.peers) if self.ms.get(name) is not None]
        return min(timed, key=lambda name: self.ms[name]) if timed else None

    @property
    def speedup(self) -> float | None:
        """The fastest baseline's time over ours: above 1 is faster than every baseline."""
        best = self.best_baseline
        return None if best is None else self.ms[best] / self.ms["tritonkit"]

    def rate_text(self) -> str:
        if self.rate is None:
            return "-"
        text = f"{self.rate:.0f} {self.unit}" if self.rate >= 10 else f"{self.rate:.3g} {self.unit}"
        return text + (f" ({self.percent_of_ceiling:.0f}%)" if self.percent_of_ceiling is not None else "")

    def cells(self, peers: Sequence[str] | None = None) -> list[str]:
        """The row under :func:`table_headers` of ``peers`` (default: this row's own other peers)."""
        peers = self.peers if peers is None else peers
        speedup = "-" if self.speedup is None else f"{self.speedup:.2f}x {baseline_name(self.best_baseline)}"
        return [self.mode, self.case_id, self.dtype, _ms(self.ms.get("tritonkit")),
                *(_ms(self.ms.get(name)) for name in (*BASELINES, *peers)), speedup, self.rate_text(),
                "CUDA graph" if self.cuda_graph else "eager", self.device, self.date]  # fmt: skip

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class KernelMeasurements:
    """A kernel's rows (fwd, bwd, fwd+bwd, those measured) and up to MAX_PLOTS plots found on this machine."""

    kernel: str
    rows: tuple[ModeRow, ...]
    plots: tuple[Path, ...] = field(default_factory=tuple)

    def line(self) -> str:
        """One line for listings: 'fwd 0.07 ms, 1.10x; bwd 0.16 ms, 1.37x against the best baseline [GPU, date]'."""
        parts = []
        for row in self.rows:
            part = f"{row.mode} {_ms(row.ms['tritonkit'])} ms"
            parts.append(part + ("" if row.speedup is None else f", {row.speedup:.2f}x"))
        where = ", ".join(dict.fromkeys(f"{row.device}, {row.date}" for row in self.rows))
        against = " against the best baseline" if any(row.speedup is not None for row in self.rows) else ""
        return "; ".join(parts) + f"{against} [{where}]"

    @property
    def peers(self) -> list[str]:
        """The other peers any of the kernel's rows timed: a column each in its table."""
        return list(dict.fromkeys(name for row in self.rows for name in row.peers))

    def headers(self) -> list[str]:
        return table_headers(self.peers)

    def table(self) -> list[list[str]]:
        """A row per mode under :meth:`headers` ("-" where a mode's run did not time a peer)."""
        return [row.cells(self.peers) for row in self.rows]


def default_results_dir() -> Path | None:
    """``benchmarks/results`` of the repository this package runs from, or None in an installed wheel."""
    import tritonkit

    # src/tritonkit/__init__.py -> the repository root is three levels up in an editable (src layout) install.
    candidate = Path(tritonkit.__file__).resolve().parents[2] / "benchmarks" / "results"
    return candidate if candidate.is_dir() else None


def _elements(case: Mapping) -> float:
    """A case's size: the product of its numbers and of its shapes' sides (flags left out)."""
    size = 1.0
    for value in case.values():
        if isinstance(value, (list, tuple)):
            size *= math.prod(v for v in value if isinstance(v, (int, float)) and not isinstance(v, bool))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            size *= value
    return size


def _work(row: dict) -> float:
    """A timed case's size: the bytes it moved or the FLOPs it ran (its rate times its time), else its elements.
    The work, not the case's numbers: appending one token per sequence to a large cache names a large cache and
    moves little (a KV-cache append of 256 tokens, launch-bound at 24% of the copy, had headed its row)."""
    rate = _rate(row)
    if rate is None:
        return _elements(row.get("case", {}))
    return float(f"{rate * row['ms']:.3g}")  # the same work timed twice (two variants of one shape) ties


def _runs(results_dir: Path):
    """(path, meta, rows) of every benchmark run (calibrations and other records skipped)."""
    for path in sorted(results_dir.glob("*/*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        rows = record.get("results") if isinstance(record, dict) else None
        if isinstance(record.get("meta"), dict) and isinstance(rows, list):
            yield path, record["meta"], [row for row in rows if isinstance(row, dict) and "spec" in row]


def _timed(rows, kernel: str, mode: str) -> dict[tuple[str, str], dict[str, dict]]:
    """(case_id, dtype) -> provider -> row, for the timed rows of one kernel and mode."""
    cases: dict[tuple[str, str], dict[str, dict]] = {}
    for row in rows:
        if row.get("spec") == kernel and row.get("mode") == mode and row.get("ms") is not None:
            cases.setdefault((row.get("case_id", ""), row.get("dtype", "")), {})[row.get("provider")] = row
    return cases


def _headline(cases: dict[tuple[str, str], dict[str, dict]]):
    """The run's case to show: bfloat16, the most baselines, the largest, the first; with its sort key."""
    best = None
    for index, ((case_id, dtype), providers) in enumerate(cases.items()):
        if "tritonkit" not in providers:
            continue
        baselines = sum(name != "tritonkit" for name in providers)
        key = (dtype == PREFERRED_DTYPE, baselines, _work(providers["tritonkit"]), -index)
        if best is None or key > best[0]:
            best = (key, case_id, dtype, providers)
    return best


def _rate(row: dict) -> float | None:
    value = row.get("tflops") if row.get("unit") == "TFLOP/s" else row.get("gbps")
    return value if value is not None and value > 0 else None  # results before the rule wrote 0.0: no model


def _stamp(meta: dict) -> str:
    """When the run was written (``time``) or, for older files, last committed (``committed``), in UTC; or ""."""
    for key in ("time", "committed"):
        try:
            moment = datetime.datetime.fromisoformat(meta[key])
        except (KeyError, TypeError, ValueError):
            continue
        if moment.tzinfo is not None:
            moment = moment.astimezone(datetime.timezone.utc)
        return moment.isoformat()
    return ""


def _pick(runs, kernel: str, mode: str, axis_for: Callable[[str], str | None], results_dir: Path) -> ModeRow | None:
    best = None
    for path, meta, rows in runs:
        headline = _headline(_timed(rows, kernel, mode))
        if headline is None:
            continue
        (is_bf16, baselines, size, _), case_id, dtype, providers = headline
        sizes = SIZES_RANK.get(meta.get("sizes"), 0)
        stamp = _stamp(meta)
        key = (baselines > 0, meta.get("date", ""), is_bf16, sizes, stamp, baselines, size,
               bool(meta.get("cuda_graph")), path.name)  # fmt: skip
        if best is None or key > best[0]:
            best = (key, path, meta, rows, case_id, dtype, providers)
    if best is None:
        return None
    _, path, meta, rows, case_id, dtype, providers = best
    ours = providers["tritonkit"]
    plot = None
    for group in plot_groups(rows, axis_for):
        if (group.spec, group.dtype, group.mode) == (kernel, dtype, mode) and case_id in group.case_ids():
            candidate = path.parent / group.filename(path.stem)
            plot = candidate.relative_to(results_dir).as_posix() if candidate.exists() else None
    rate = _rate(ours)
    standard = ("tritonkit", *BASELINES)
    ms = {name: providers[name]["ms"] if name in providers else None for name in standard}
    ms.update((name, row["ms"]) for name, row in providers.items() if name not in standard)  # other peers: if timed
    return ModeRow(
        mode=mode,
        case_id=case_id,
        dtype=dtype,
        device=meta.get("device", path.parent.name),
        date=meta.get("date", ""),
        cuda_graph=bool(meta.get("cuda_graph")),
        source=path.relative_to(results_dir).as_posix(),
        ms=ms,
        unit=ours.get("unit", "GB/s"),
        rate=rate,
        percent_of_ceiling=ours.get("percent_of_ceiling") if rate is not None else None,
        plot=plot,
    )


def summarize(results_dir: Path, kernels: Mapping[str, str]) -> dict:
    """The summary of ``results_dir`` for ``kernels`` (name -> swept axis): what measured.json holds."""
    runs = list(_runs(results_dir)) if results_dir.is_dir() else []
    summary = {}
    for kernel in sorted(kernels):
        rows = [_pick(runs, kernel, mode, kernels.get, results_dir) for mode in MODES]
        if any(rows):
            summary[kernel] = [row.to_dict() for row in rows if row is not None]
    return {"results": "benchmarks/results", "kernels": summary}


def summary_text(summary: dict) -> str:
    return json.dumps(summary, indent=1, sort_keys=False) + "\n"


def shipped_summary(path: Path = SUMMARY_FILE) -> dict:
    """The summary shipped in the package ({} kernels when the file is missing)."""
    return json.loads(path.read_text()) if path.exists() else {"kernels": {}}


def for_kernel(summary: dict, kernel: str, results_dir: Path | None) -> KernelMeasurements | None:
    """A kernel's measurements from a summary, with the plots that exist under ``results_dir`` (none without it)."""
    rows = tuple(ModeRow(**row) for row in summary.get("kernels", {}).get(kernel, ()))
    if not rows:
        return None
    plots = []
    if results_dir is not None:
        plots = [results_dir / row.plot for row in rows if row.plot and (results_dir / row.plot).is_file()]
    return KernelMeasurements(kernel, rows, tuple(dict.fromkeys(plots))[:MAX_PLOTS])


def axes_of(specs) -> dict[str, str]:
    """Kernel name -> swept axis, for :func:`summarize`."""
    return {spec.name: spec.sweep for spec in specs}


def loader(results_dir: Path | str | None, specs) -> Callable[[str], KernelMeasurements | None]:
    """Measurements by kernel: from ``results_dir`` ("default": the checkout's results folder, else the shipped
    summary; None: none at all)."""
    if results_dir is None:
        return lambda kernel: None
    if results_dir == "default":
        results_dir = default_results_dir()
        summary = shipped_summary() if results_dir is None else summarize(results_dir, axes_of(specs))
    else:
        results_dir = Path(results_dir)
        summary = summarize(results_dir, axes_of(specs))
    return lambda kernel: for_kernel(summary, kernel, results_dir)
